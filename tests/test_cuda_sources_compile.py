"""Every .cu file under kernels/ and benchmarks/ compiles with plain nvcc for
sm_90.

The .cu files include no torch headers, so this runs wherever nvcc exists --
including machines without a GPU or a CUDA build of torch -- and catches a
broken CUDA file before it reaches a GPU machine. The defines torch's
extension build passes to nvcc are passed here too: they remove the implicit
half / bfloat16 conversions, and code that leans on those fails only there.
"""

import pathlib
import shutil
import subprocess

import pytest
from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
CUDA_FILES = sorted(KERNELS.rglob("*.cu")) + sorted((ROOT / "benchmarks").glob("*.cu"))
NVCC = shutil.which("nvcc")


def test_there_are_cuda_sources():
    assert CUDA_FILES, "no .cu files found under kernels/"


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("source", CUDA_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cuda_source_compiles_for_sm90(source, tmp_path):
    cmd = [NVCC, "-std=c++17", "-O1", "-arch=sm_90", *COMMON_NVCC_FLAGS,
           "-I", str(KERNELS), "-c", str(source), "-o", str(tmp_path / "out.o")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
