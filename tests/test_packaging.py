"""The package as a user gets it: a wheel built with ``pip wheel .`` installs
into a fresh virtual environment and runs one op of each family from outside
the source tree, and the source distribution carries every kernel source
(headers and .cu files included, whatever this machine builds).

Slow tier: the wheel is built from this tree (reusing the objects of an
in-place build when there is one, so after scripts/setup.sh it only links).
"""

import os
import pathlib
import subprocess
import sys
import tarfile
import textwrap

import pytest

import baracuda_torch

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNEL_SUFFIXES = {".cpp", ".h", ".cuh", ".cu"}

# One op of each family against torch's own result, on CPU.
ONE_OP_PER_FAMILY = textwrap.dedent("""
    import sys
    import torch
    import torch.nn.functional as F
    import baracuda_torch as bt
    from baracuda_torch import masks

    print(bt.__file__)
    g = torch.Generator().manual_seed(0)

    dest = torch.randn(4, 6, generator=g)
    source = torch.randn(2, 3, generator=g)
    ref = dest.clone()
    ref[1:3, 2:5] = source
    assert torch.equal(bt.write_slice_(dest, source, [(1, 3), (2, 5)]), ref)

    x = torch.randn(3, 17, generator=g, dtype=torch.float64)
    torch.testing.assert_close(bt.cumsum(x, 1), torch.cumsum(x, 1))

    va, vb = torch.randn(2, 4, 8, generator=g), torch.randn(2, 4, 8, generator=g)
    sa, sb = torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
    wa, wb = torch.exp2(sa), torch.exp2(sb)
    out, lse = bt.merge_state(va, sa, vb, sb)
    torch.testing.assert_close(out, (va * wa[..., None] + vb * wb[..., None])
                               / (wa + wb)[..., None])
    torch.testing.assert_close(lse, torch.log2(wa + wb))

    q, k, v = (torch.randn(1, 2, 128, 32, generator=g) for _ in range(3))
    m = masks.causal(128, 128, 64)
    dense = masks.to_dense(m, 128, 128, 64, is_causal=True)
    torch.testing.assert_close(
        bt.block_sparse_attention(q, k, v, m, block_size=64, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=dense), atol=1e-4, rtol=1e-4)

    x = torch.randn(2, 3, 9, 9, generator=g)
    samples = torch.rand(2, 3, 2, generator=g)
    assert torch.equal(bt.fractional_max_pool2d(x, 2, (4, 4), _random_samples=samples),
                       F.fractional_max_pool2d(x, 2, (4, 4), _random_samples=samples))
    print("five families ok")
""")


def run(cmd, **kwargs):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_wheel_installs_into_a_fresh_venv_and_runs_every_family(tmp_path):
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps",
         "-w", wheels], cwd=ROOT)
    (wheel,) = wheels.glob("baracuda_torch-*.whl")
    assert f"-{baracuda_torch.__version__}-" in wheel.name

    # The venv sees the system's torch; the package comes from the wheel alone.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv])
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", wheel])

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = run([python, "-c", ONE_OP_PER_FAMILY], cwd=outside, env=env)
    installed_at = pathlib.Path(out.splitlines()[0]).resolve()
    assert venv.resolve() in installed_at.parents, f"imported from {installed_at}, not the venv"
    assert "five families ok" in out


def test_sdist_carries_every_kernel_source_and_no_build_output(tmp_path):
    # What `python -m build --sdist --no-isolation` runs, without the frontend.
    run([sys.executable, "-c",
         f"from setuptools import build_meta; build_meta.build_sdist({str(tmp_path)!r})"],
        cwd=ROOT)
    (sdist,) = tmp_path.glob("baracuda_torch-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {pathlib.PurePosixPath(n).relative_to(n.split("/", 1)[0]).as_posix()
                 for n in tar.getnames() if "/" in n}

    expected = {p.relative_to(ROOT).as_posix() for p in (ROOT / "kernels").rglob("*")
                if p.suffix in KERNEL_SUFFIXES}
    expected |= {p.relative_to(ROOT).as_posix() for d in ("scripts", "tests")
                 for p in (ROOT / d).iterdir() if p.suffix in (".sh", ".py")}
    expected |= {"LICENSE", "README.md", "pyproject.toml", "setup.py",
                 "baracuda_torch/_version.py"}
    assert any(n.endswith(".cuh") for n in expected) and any(n.endswith(".cu") for n in expected)
    missing = sorted(expected - names)
    assert not missing, f"{sdist.name} lacks {missing}"
    built = sorted(n for n in names if n.endswith((".so", ".o", ".pyc")))
    assert not built, f"{sdist.name} carries build output {built}"
