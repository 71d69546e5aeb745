"""benchmarks/compare_builds.py: two builds' rows side by side (here this
tree's build against itself, the small cases, on CPU)."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "compare_builds.py"


def built_in_place():
    return any((ROOT / "baracuda_torch").glob("_C*"))


def compare(base, head, out):
    return subprocess.run([sys.executable, str(SCRIPT), str(base), str(head), "--quick",
                           "--family", "scan_shapes", "--case", "cumsum fwd", "--passes", "1",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(not built_in_place(), reason="the extension is not built in this tree")
def test_every_row_gets_both_builds_and_a_ratio(tmp_path):
    run = compare(ROOT, ROOT, tmp_path / "table.md")
    assert run.returncode == 0, run.stderr
    text = (tmp_path / "table.md").read_text()
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| scan_shapes")]
    # cumsum forward on the two small shapes, float32 and bfloat16.
    assert len(rows) == 4
    for _, case, _, base_us, head_us, ratio in rows:
        assert case.strip().startswith("cumsum fwd")
        assert float(base_us) > 0 and float(head_us) > 0
        assert float(ratio) == pytest.approx(float(base_us) / float(head_us), rel=0.01)
    assert "4 rows, 1 passes of each build" in text and "geometric mean" in text


@pytest.mark.skipif(not built_in_place(), reason="the extension is not built in this tree")
def test_a_tree_without_its_own_build_is_refused(tmp_path):
    # The package's Python files alone: whatever extension it could import
    # would be another tree's.
    bare = tmp_path / "bare"
    shutil.copytree(ROOT / "baracuda_torch", bare / "baracuda_torch",
                    ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    run = compare(ROOT, bare, tmp_path / "table.md")
    assert run.returncode != 0
    # Refused for its extension: another tree's (an editable install), or none.
    assert ("compare_builds: the extension came from" in run.stderr
            or "baracuda_torch._C" in run.stderr or "cannot import name '_C'" in run.stderr), run.stderr
    assert not (tmp_path / "table.md").exists()
