"""The main job's command line: ``python -m baracuda_torch [--family F] [--device D]``."""

import pytest
import torch

from baracuda_torch.__main__ import main

FAMILIES = ["write_slice", "merge", "scan", "fractional_max_pool", "block_sparse_attention"]


def test_help_lists_the_options_and_runs_nothing(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--family" in out and "--device" in out
    assert all(name in out for name in FAMILIES)
    assert "main job:" not in out


def test_one_family_on_cpu_runs_only_that_family(capsys):
    assert main(["--family", "merge", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "| op " not in line]
    assert rows and all(row.split("|")[1].strip().startswith("merge_state") for row in rows)
    assert all(row.split("|")[2].strip() == "cpu" for row in rows)


def test_families_repeat_and_separate_by_commas(capsys):
    assert main(["--family", "write_slice,fractional_max_pool", "--family", "merge",
                 "--device", "cpu"]) == 0
    ops = {line.split("|")[1].strip().split()[0] for line in capsys.readouterr().out.splitlines()
           if line.startswith("| ") and "| op " not in line}
    assert {op.rstrip("_") for op in ops} >= {"write_slice", "merge_state", "fractional_max_pool2d"}
    assert not any(op.startswith(("cum", "block_sparse")) for op in ops)


def test_unknown_family_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--family", "scan,nosuch"])
    assert "nosuch" in str(exit_info.value.code) and "write_slice" in str(exit_info.value.code)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no CUDA")
def test_cuda_is_refused_where_there_is_none():
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "cuda"])
    assert "cuda" in str(exit_info.value.code) and "not available" in str(exit_info.value.code)
