"""Every library .cu file under kernels/ compiles with plain nvcc for Hopper.

The .cu files include no torch headers, so this runs wherever nvcc exists --
including machines without a GPU or a CUDA build of torch -- and catches a
broken CUDA file before it reaches a GPU machine. The defines torch's
extension build passes to nvcc are passed here too: they remove the implicit
half / bfloat16 conversions, and code that leans on those fails only there.
The target is sm_90a with BARACUDA_SM90A, as the extension is built for
H100 / H200, so the wgmma kernels are compiled too.

Compiled to PTX with cicc at -O0: the front end parses and checks the whole
file, host code included, and instantiates every template a kernel or a
launcher uses; cicc lowers every instantiated kernel; and nvcc hands the PTX
to ptxas for checking (inline asm included). Left out are the host
compiler's pass and ptxas's machine-code generation, which took ~14x the
time (scan_forward_float16.cu: 164 s at -O1 to an object, 60 s with cicc and
ptxas at -O0, 11 s to PTX). The files compile in parallel, one per core.
"""

import concurrent.futures
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest
from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
CUDA_FILES = sorted(KERNELS.rglob("*.cu"))
NVCC = shutil.which("nvcc")


def nvcc_command(source: pathlib.Path, out: pathlib.Path) -> list:
    return [NVCC, "-std=c++17", "-arch=sm_90a", "-DBARACUDA_SM90A", *COMMON_NVCC_FLAGS,
            "--ptx", "-Xcicc", "-O0", "-I", str(KERNELS), str(source), "-o", str(out)]


def compile_all(sources) -> dict:
    """source -> (command, CompletedProcess), compiled concurrently."""
    workers = max(1, len(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory() as tmp, \
            concurrent.futures.ThreadPoolExecutor(workers) as pool:
        def one(index_and_source):
            index, source = index_and_source
            cmd = nvcc_command(source, pathlib.Path(tmp) / f"{index}.ptx")
            return source, cmd, subprocess.run(cmd, capture_output=True, text=True)
        return {s: (cmd, r) for s, cmd, r in pool.map(one, enumerate(sources))}


@pytest.fixture(scope="module")
def compiled(request):
    """The compile of every .cu file that this session selected, all at once."""
    selected = [item.callspec.params["source"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_kernel_source_compiles_for_hopper"]
    return compile_all(selected)


def test_there_are_kernel_sources():
    assert CUDA_FILES, "no .cu files found under kernels/"


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("source", CUDA_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_kernel_source_compiles_for_hopper(source, compiled):
    cmd, result = compiled[source]
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"


HOPPER_ATTENTION = {"block_sparse_attention_hopper.cu": "hopper_attention",
                    "block_sparse_attention_hopper_backward.cu": "hopper_grad"}


@pytest.fixture(scope="module")
def hopper_machine_code():
    """ptxas's report on each Hopper attention file compiled as the extension
    builds it (-O3, to machine code; the host pass is left out), the files
    side by side."""
    def one(source):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [NVCC, "-std=c++17", "-arch=sm_90a", "-DBARACUDA_SM90A", *COMMON_NVCC_FLAGS,
                   "-O3", "-I", str(KERNELS), "-cubin",
                   str(KERNELS / "block_sparse_attention" / source), "-o", f"{tmp}/kernels.cubin"]
            return source, cmd, subprocess.run(cmd, capture_output=True, text=True)
    with concurrent.futures.ThreadPoolExecutor(len(HOPPER_ATTENTION)) as pool:
        return {s: (cmd, r) for s, cmd, r in pool.map(one, HOPPER_ATTENTION)}


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("source", sorted(HOPPER_ATTENTION))
def test_hopper_attention_mmas_are_not_serialised(source, hopper_machine_code):
    """ptxas serialises every wgmma of a kernel when code that may diverge (a
    barrier's spin loop, a branch) sits between the issues of in-flight MMAs
    (warning C7520; 9-25 % of the attention forward's speed), or when the
    accumulators in flight and the rest of the live state do not fit the
    warpgroup's registers (C7512; the fused backward at 224 registers). No
    forward or backward kernel may draw either."""
    cmd, result = hopper_machine_code[source]
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
    serialised = [line for line in result.stderr.splitlines()
                  if ("C7520" in line or "C7512" in line) and HOPPER_ATTENTION[source] in line]
    assert not serialised, "\n".join(serialised)
