"""scan_path with an op: the kernel the CUDA launcher chooses, named by the
launcher's own choice, and the one that then runs (seen by the profiler)."""

import re

import pytest
import torch

import baracuda_torch as bt

CUDA = torch.cuda.is_available()
SM90 = CUDA and torch.cuda.get_device_capability() >= (9, 0)
ON_CUDA = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def meta(*shape, dtype=torch.float32):
    return torch.empty(shape, device="meta", dtype=dtype)


def test_integer_follows_the_result_dtype():
    ints = torch.zeros(4, 8, dtype=torch.int32)
    floats = torch.zeros(4, 8)
    assert bt.scan_path(ints, 1) == "integer"
    assert bt.scan_path(ints, 1, dtype=torch.float32) == "row_groups"
    assert bt.scan_path(floats, 1, dtype=torch.int64) == "integer"
    assert bt.scan_path(floats, 1) == "row_groups"
    assert bt.scan_path(ints, 1, "cumsum") == "integer"
    assert bt.scan_path(ints, 1, "cummax") == "integer"
    assert bt.scan_path(floats, 1, "cumprod", dtype=torch.int16) == "integer"
    assert bt.scan_path(ints, 1, "cumsum", dtype=torch.float64) == "host"
    assert bt.scan_path(floats, 1, "logcumsumexp", backward=True, reverse=True) == "host"
    assert bt.scan_path(torch.zeros(0, 8), 1, "cummin") == "empty"


def test_bad_requests_raise():
    x = torch.zeros(4, 8)
    with pytest.raises(RuntimeError, match="kind='cumsums' must be one of"):
        bt.scan_path(x, 1, "cumsums")
    with pytest.raises(RuntimeError, match="backward=True needs kind="):
        bt.scan_path(x, 1, backward=True)
    with pytest.raises(RuntimeError, match="an integer scan has no backward"):
        bt.scan_path(x, 1, "cumsum", backward=True, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="dtype= is for cumsum and cumprod"):
        bt.scan_path(x, 1, "cummax", dtype=torch.float64)
    with pytest.raises(RuntimeError, match="dim=2 out of range"):
        bt.scan_path(x, 2, "cumsum")


@pytest.mark.skipif(CUDA, reason="a CUDA device is present")
def test_kernel_of_a_meta_tensor_needs_a_cuda_device():
    with pytest.raises(RuntimeError, match="kind= names a CUDA kernel"):
        bt.scan_path(meta(4, 8), 1, "cumsum")


# (shape, dim, dtype, kind, backward, reverse, kernel) on a GPU of compute
# capability 9.0 or more with as many SMs as an H100 or H200 (the swizzled
# tiles want a tile for every SM).
BF16, F32 = torch.bfloat16, torch.float32
SM90_KERNELS = [
    ((1, 1 << 24), -1, BF16, "cumsum", False, False, "staged_rows"),
    ((1, 1 << 24), -1, F32, "cumprod", False, True, "staged_rows"),
    ((1, 1 << 24), -1, BF16, "cumsum", True, False, "staged_rows"),
    ((1, 1 << 24), -1, BF16, "logcumsumexp", False, False, "swizzled_runs"),
    ((1, 1 << 24), -1, F32, "logcumsumexp", False, True, "swizzled_runs"),
    ((1, 1000003), -1, F32, "logcumsumexp", False, False, "staged_rows"),  # part of a line
    ((1, 1 << 24), -1, BF16, "cummax", False, False, "staged_extremes"),
    ((1, 1 << 24), -1, F32, "cummin", False, True, "staged_extremes"),
    ((1, 1 << 24), -1, BF16, "cumprod", True, False, "staged_cumprod_grad"),
    ((1, 1 << 24), -1, F32, "logcumsumexp", True, False, "staged_logcumsumexp_grad"),
    ((1, 1 << 24), -1, BF16, "logcumsumexp", True, True, "swizzled_logcumsumexp_grad"),
    ((1, 1 << 24), -1, BF16, "cummax", True, False, "keyed_rows"),
    ((1, 1 << 24), -1, torch.float64, "cummax", False, False, "long_rows"),
    ((4096, 8192), -1, BF16, "logcumsumexp", False, False, "warp_rows"),
    ((4096, 8192), -1, BF16, "cumsum", False, False, "rows"),
    ((1 << 20, 16), -1, F32, "cumsum", True, False, "row_groups"),
    ((4096, 8192), 0, BF16, "cumprod", True, False, "staged_strips"),
    ((4096, 8192), 0, torch.float64, "cumsum", False, False, "column_strips"),
    ((1, 4096, 1024), 1, BF16, "logcumsumexp", False, False, "long_strip_tiles"),
    ((16, 2048, 64), 1, F32, "logcumsumexp", True, False, "strip_tiles"),
    ((128, 1000, 7), 1, F32, "cummax", True, False, "column_tiles"),
    ((40000, 3), 0, F32, "cumsum", False, False, "columns"),
]


@pytest.mark.skipif(not SM90, reason="needs a GPU of compute capability 9.0 or more")
@pytest.mark.parametrize("shape,dim,dtype,kind,backward,reverse,kernel", SM90_KERNELS,
                         ids=lambda v: str(v))
def test_kernel_choices_on_sm90(shape, dim, dtype, kind, backward, reverse, kernel):
    if torch.cuda.get_device_properties(0).multi_processor_count < 114:
        pytest.skip("the swizzled tiles' choice depends on the SM count")
    got = bt.scan_path(meta(*shape, dtype=dtype), dim, kind, backward=backward, reverse=reverse)
    assert got == kernel


@ON_CUDA
def test_alignment_is_read_from_x():
    x = torch.zeros(1 << 20, device="cuda")
    aligned = bt.scan_path(x, 0, "cumsum")
    assert bt.scan_path(x[1:], 0, "cumsum") == "long_rows"  # 4 bytes past an allocation
    assert bt.scan_path(x[1:].clone(), 0, "cumsum") == aligned
    # A copy the op makes (a strided x) is a fresh allocation.
    assert bt.scan_path(x[1::2], 0, "cumsum") == bt.scan_path(meta(1 << 19), 0, "cumsum")


# The kernel template each reported name launches (the profiler's demangled
# name), and for the staged rows their tiles' type.
LAUNCHED = {
    "row_groups": r"::row_groups_kernel<",
    "warp_rows": r"::warp_rows_kernel<",
    "rows": r"::rows_kernel<",
    "long_rows": r"::long_rows_kernel<",
    "staged_rows": r"::staged_rows_kernel<.*StagedPlainTiles<",
    "swizzled_runs": r"::staged_rows_kernel<.*StagedSwizzledRunTiles<",
    "staged_extremes": r"::staged_rows_kernel<.*StagedExtremeTiles<",
    "staged_cumprod_grad": r"::staged_rows_kernel<.*StagedCumprodGradTiles<",
    "staged_logcumsumexp_grad": r"::staged_rows_kernel<.*StagedLogcumsumexpGradTiles<",
    "swizzled_logcumsumexp_grad": r"::staged_rows_kernel<.*StagedSwizzledGradTiles<",
    "keyed_rows": r"::keyed_tiles_kernel<",
    "column_strips": r"::column_strips_kernel<",
    "staged_strips": r"::staged_strips_kernel<",
    "strip_tiles": r"::strip_tiles_kernel<.*, (false|\(bool\)0)>",
    "long_strip_tiles": r"::strip_tiles_kernel<.*, (true|\(bool\)1)>",
    "column_tiles": r"::column_tiles_kernel<",
    "columns": r"::column_segment_kernel<",
}


def launched_kernels(fn):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


SMALL_CASES = [  # every kernel, on shapes small enough for a quick test
    ((64, 16), -1, F32, "cumsum", False),
    ((4096, 512), -1, BF16, "logcumsumexp", False),
    ((8, 4096), -1, F32, "cumsum", False),
    ((2, 1 << 20), -1, BF16, "cumsum", False),
    ((2, 1 << 20), -1, F32, "logcumsumexp", False),
    ((2, 1 << 20), -1, BF16, "cummax", False),
    ((2, 1 << 20), -1, F32, "cumprod", True),
    ((2, 1 << 20), -1, F32, "logcumsumexp", True),
    ((2, 1 << 20), -1, BF16, "logcumsumexp", True),
    ((2, 1 << 20), -1, F32, "cummin", True),
    ((2, 1 << 20), -1, torch.float64, "cummax", False),
    ((512, 4096), 0, BF16, "cumprod", True),
    ((512, 4096), 0, torch.float64, "cumsum", False),
    ((1, 2048, 1024), 1, BF16, "logcumsumexp", False),
    ((16, 2048, 64), 1, F32, "cumsum", True),
    ((128, 1000, 7), 1, F32, "cummax", True),
    ((40000, 3), 0, F32, "cumsum", False),
]


@ON_CUDA
@pytest.mark.parametrize("shape,dim,dtype,kind,backward", SMALL_CASES, ids=lambda v: str(v))
def test_reported_kernel_is_the_one_that_runs(shape, dim, dtype, kind, backward):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (1 + 1e-3 * torch.randn(shape, generator=g, device="cuda")).to(dtype)
    name = bt.scan_path(x, dim, kind, backward=backward)
    if not backward:
        run = lambda: getattr(bt, kind)(x, dim)  # noqa: E731
    else:
        out = getattr(bt, kind)(x, dim)
        y, idx = (out[0], out[1]) if kind in ("cummax", "cummin") else (out, None)
        saved = (x, y) if kind in ("cumprod", "logcumsumexp") else (None, None)
        dy = torch.randn(shape, generator=g, device="cuda").to(dtype)
        run = lambda: torch.ops.baracuda.scan_backward(  # noqa: E731
            dy, saved[0], saved[1], idx, dim, kind, False)
    kernels = launched_kernels(run)
    assert any(re.search(LAUNCHED[name], k) for k in kernels), (name, kernels)
