"""Scans: cumsum, cumprod, logcumsumexp, cummax, cummin (+ scan_backward).

References are torch's own ops in float64 on the same values (upcasting is
exact, so cummax / cummin indices must match torch's bit for bit, ties and
NaN included); reverse=True is checked against flip / scan / flip. Shapes are
chosen so that, on CUDA, every path of the engine runs (see test_paths).
"""

import math

import pytest
import torch
from torch.testing._internal.optests import opcheck

import baracuda_torch as bt
from helpers import poison_allocator

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
PLAIN = ["cumsum", "cumprod", "logcumsumexp"]
EXTREME = ["cummax", "cummin"]
ALL_OPS = PLAIN + EXTREME
NAN, INF = float("nan"), float("inf")

# Shapes / dims that reach each CUDA path (scan_plan.h).
PATH_CASES = [
    ((3, 1700), -1, "rows"),
    ((2, 300000), -1, "long_rows"),  # several tile groups per row
    ((256, 2100), 1, "rows"),        # two chunks per row
    ((5, 2001), -1, "rows"),         # odd rows: most start off a 16-byte boundary
    ((500, 9), -1, "row_groups"),    # two lanes a row, a last warp part full
    ((70, 1), -1, "row_groups"),     # rows of one element
    ((37, 64), -1, "row_groups"),    # eight lanes a row
    ((33, 1000), -1, "row_groups"),  # a warp a row, four chunks, the last ragged
    ((9, 257), -1, "row_groups"),    # a warp a row, one element into a second chunk
    ((1, 50000), -1, "long_rows"),
    ((32769, 2), 0, "columns"),     # more tile groups than column_tiles takes: segments
    ((3, 20000, 1), 1, "long_rows"),
    ((3, 40), 0, "columns"),        # one tile, one segment
    ((2, 12, 5, 3), 1, "columns"),
    ((1100, 7), 0, "column_tiles"),     # few columns, several tile groups
    ((32, 530, 33), 1, "column_tiles"),  # over 1024 columns, strip lanes idle
    ((4200, 64), 0, "column_tiles"),    # an axis too long for strip_tiles
    ((2, 33, 5, 3), 1, "column_tiles"),
    ((300, 1100), 0, "strip_tiles"),    # a last strip of 12 columns
    ((1100, 1024), 0, "strip_tiles"),   # many tiles a strip, the last short
    ((40, 3, 512), 0, "strip_tiles"),   # two tiles
    ((3, 500, 64), 1, "strip_tiles"),   # strips of several outer indices
    ((300, 8200), 0, "column_strips"),     # a last strip of 8 columns, a short last step
    ((9, 200, 1000), 1, "column_strips"),  # strips of several outer indices
    ((2, 300, 2048), 1, "column_strips"),  # 128 strips, as few as the path takes
    ((8, 50, 1001), 1, "column_strips"),   # rows of 1001 elements: loads through registers
]
# The first case of every path (the backward tests run these).
ONE_PER_PATH = [c for k, c in enumerate(PATH_CASES) if c[2] not in {d[2] for d in PATH_CASES[:k]}]


def ours(name, x, dim, reverse=False):
    out = getattr(bt, name)(x, dim, reverse=reverse)
    return tuple(out) if name in EXTREME else out


def outputs(out):
    """An op's result as a tuple of tensors (cummax / cummin give two)."""
    return out if isinstance(out, tuple) else (out,)


def misaligned(x):
    """x's values in a contiguous tensor whose data starts one element past
    where an allocation does (16-byte aligned or more)."""
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    out = buf[1:].view(x.shape)
    out.copy_(x)
    return out


def reference(name, x, dim, reverse=False):
    """torch's CPU op in float64, flipped around for reverse; indices mapped
    back to the original coordinates."""
    x64 = x.double().cpu()
    if x.dim() == 0:
        x64 = x64.reshape(1)
    d = dim if x.dim() else 0
    src = x64.flip(d) if reverse else x64
    out = getattr(torch, name)(src, d)
    if name in EXTREME:
        v, i = out
        if reverse:
            v, i = v.flip(d), (x64.shape[d] - 1 - i).flip(d)
        if x.dim() == 0:
            v, i = v.reshape(()), i.reshape(())
        return v, i
    out = out.flip(d) if reverse else out
    return out.reshape(()) if x.dim() == 0 else out


def tol(dtype, length):
    grow = math.sqrt(max(length, 1))
    return {torch.float16: dict(atol=2e-3 * grow, rtol=2e-3),
            torch.bfloat16: dict(atol=1.6e-2 * grow, rtol=1.6e-2),
            torch.float32: dict(atol=2e-6 * grow, rtol=2e-5),
            torch.float64: dict(atol=1e-12 * grow, rtol=1e-12)}[dtype]


def random_input(shape, dtype, device, g, name="cumsum"):
    """Random values with zeros and ties; cumprod gets factors near 1 so long
    products neither overflow nor vanish."""
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if name == "cumprod":
        x = 1 + 0.05 * x
    x = torch.where(torch.rand(shape, generator=g) < 0.05, torch.zeros(()), x)
    ties = torch.rand(shape, generator=g) < 0.3
    x = torch.where(ties, torch.round(x * 2) / 2, x)
    return x.to(dtype).to(device)


def float32_quick(dtypes):
    """dtypes as parameters, all but float32 in the slow tier: the long-row
    sweeps take tens of seconds per dtype on a GPU, and float32 keeps each
    path covered in the quick tier."""
    return [d if d == torch.float32 else pytest.param(d, marks=pytest.mark.slow) for d in dtypes]


# The two 16-bit dtypes share every kernel of the sweeps that take them:
# bfloat16 in the quick tier, float16 in the slow one.
BFLOAT16_QUICK = [pytest.param(torch.float16, marks=pytest.mark.slow), torch.bfloat16]
DTYPES_FLOAT16_SLOW = [pytest.param(torch.float16, marks=pytest.mark.slow), torch.bfloat16,
                       torch.float32, torch.float64]


def check(name, x, dim, reverse, dtype=None):
    dtype = dtype or x.dtype
    got = ours(name, x, dim, reverse)
    ref = reference(name, x, dim, reverse)
    length = x.shape[dim] if x.dim() else 1
    if name in EXTREME:
        assert got[0].dtype == x.dtype and got[1].dtype == torch.int64
        torch.testing.assert_close(got[0].double().cpu(), ref[0].cpu(), atol=0, rtol=0, equal_nan=True)
        assert torch.equal(got[1].cpu(), ref[1].cpu())
    else:
        assert got.dtype == x.dtype and got.shape == x.shape
        # Half outputs are rounded once; compare against the rounded reference.
        torch.testing.assert_close(got.double().cpu(), ref.to(dtype).double().cpu(),
                                   **tol(dtype, length), equal_nan=True)


# ---------------------------------------------------------------- forward


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ALL_OPS)
def test_forward_every_dtype_dim_and_direction(device, dtype, name, rng):
    x = random_input((4, 37, 6), dtype, device, rng, name)
    for dim in (0, 1, 2, -1, -3):
        for reverse in (False, True):
            check(name, x, dim, reverse)


@pytest.mark.parametrize("dtype", DTYPES_FLOAT16_SLOW, ids=str)
@pytest.mark.parametrize("name", ALL_OPS)
def test_forward_every_dtype_on_every_path(device, dtype, name, rng):
    # Storage size picks the CUDA kernels' items per thread and vector loads.
    for shape, dim, _ in ONE_PER_PATH + [((5, 2001), -1, "rows"), ((33, 1000), -1, "row_groups")]:
        x = random_input(shape, dtype, device, rng, name)
        for reverse in (False, True):
            check(name, x, dim, reverse)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_OPS)
@pytest.mark.parametrize("shape,dim,path", PATH_CASES, ids=lambda v: str(v))
def test_every_cuda_path(device, name, shape, dim, path, rng):
    assert bt.scan_path(torch.empty(shape, device="meta"), dim) == path
    x = random_input(shape, torch.float32, device, rng, name)
    for reverse in (False, True):
        check(name, x, dim, reverse)


def test_paths():
    meta = lambda *s: torch.empty(s, device="meta")  # noqa: E731
    assert bt.scan_path(meta(0, 5), 1) == "empty"
    assert bt.scan_path(meta(4096, 8192), -1) == "rows"
    assert bt.scan_path(meta(4096, 1024), -1) == "row_groups"
    assert bt.scan_path(meta(4096, 1025), -1) == "rows"
    assert bt.scan_path(meta(4096, 8192), 0) == "column_strips"
    assert bt.scan_path(meta(2048, 4096), 0) == "column_strips"  # 128 strips
    assert bt.scan_path(meta(2048, 4064), 0) == "strip_tiles"  # 127: too few strips
    assert bt.scan_path(meta(1100, 1024), 0) == "strip_tiles"
    assert bt.scan_path(meta(4096, 96), 0) == "strip_tiles"  # three strips, 128 short tiles
    assert bt.scan_path(meta(4097, 96), 0) == "column_tiles"  # more
    assert bt.scan_path(meta(300, 100, 40), 1) == "column_tiles"  # strip lanes 3 in 8 idle
    assert bt.scan_path(meta(4096, 7), 0) == "column_tiles"  # few columns
    assert bt.scan_path(meta(16, 96), 0) == "columns"  # one tile
    assert bt.scan_path(meta(40000, 3), 0) == "columns"  # too many tile groups
    assert bt.scan_path(meta(40000, 2048), 0) == "columns"  # too many tile groups
    assert bt.scan_path(meta(32768, 4064), 0) == "columns"  # too much workspace
    assert bt.scan_path(meta(1, 1 << 24), -1) == "long_rows"
    # Axes past INT32_MAX (64-bit positions) take the general path of their layout.
    assert bt.scan_path(meta(1, 2**31), -1) == "long_rows"
    assert bt.scan_path(meta(2**31, 4096), 0) == "columns"


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_positions_past_int32_max(name):
    """cummax / cummin along an axis longer than INT32_MAX carry 64-bit
    positions: x repeats 0..2999, so every index after the first period is the
    latest position of the period's extreme, and with dy all ones each such
    position's gradient is the count of positions pointing at it (exact).
    Checked a slice at a time, in closed form, to hold memory down."""
    n, period = 2**31 + 4500, 3000
    if torch.cuda.mem_get_info()[0] < 64 << 30:
        pytest.skip("needs 64 GiB of free GPU memory")
    x = (torch.arange(n, device="cuda") % period).float()
    y, idx = getattr(bt, name)(x, 0)
    dx = torch.ops.baracuda.scan_backward(torch.ones(n, device="cuda"), None, None, idx, 0,
                                          name, False)
    extreme_at = period - 1 if name == "cummax" else 0
    for first in range(0, n, 1 << 28):
        pos = torch.arange(first, min(n, first + (1 << 28)), device="cuda")
        # The latest position at or before each whose x is the period's
        # extreme (cummax: the first period rises, each its own index).
        want = (pos - extreme_at).div(period, rounding_mode="floor") * period + extreme_at
        grad = torch.where(pos % period == extreme_at, (n - pos).clamp(max=period), 0).float()
        if name == "cummax":
            want = torch.where(pos < period, pos, want)
            grad = torch.where(pos < period - 1, 1.0, grad)
        at = slice(first, first + pos.numel())
        assert torch.equal(idx[at], want), first
        assert torch.equal(y[at], (want % period).float()), first
        assert torch.equal(dx[at], grad), first


@pytest.mark.parametrize("name", ALL_OPS)
def test_special_values(device, name):
    # inf, -inf, NaN (first NaN sticks for cummax/cummin), ties, signed zeros.
    rows = [
        [1.0, NAN, 3.0, NAN, -1.0],
        [INF, 2.0, -INF, 2.0, 2.0],
        [-INF, -INF, 0.0, -0.0, 0.0],
        [0.0, 5.0, 0.0, 5.0, -0.0],
        [-INF, -INF, -INF, -INF, 1.0],
        [2.0, 2.0, 2.0, NAN, 2.0],
    ]
    for dtype in DTYPES:
        x = torch.tensor(rows, dtype=dtype, device=device)
        for reverse in (False, True):
            check(name, x, 1, reverse)
            check(name, x.t(), 0, reverse)


@pytest.mark.parametrize("name", ALL_OPS)
def test_strided_transposed_and_expanded(device, name, rng):
    base = random_input((6, 10, 8), torch.float32, device, rng, name)
    views = [base.transpose(0, 2), base[:, ::3, 1::2], base[..., :1].expand(6, 10, 5),
             base.permute(1, 2, 0)[2:, :, ::2]]
    for v in views:
        for dim in range(v.dim()):
            check(name, v, dim, reverse=dim % 2 == 1)


@pytest.mark.parametrize("name", ALL_OPS)
def test_empty_length_one_scalar_and_rank_8(device, name, rng):
    for shape, dim in [((0,), 0), ((3, 0, 2), 1), ((3, 0, 2), 0), ((5, 1, 3), 1), ((1,), 0),
                       ((2, 1, 2, 1, 3, 1, 2, 2), 4), ((2, 1, 2, 1, 3, 1, 2, 2), -8)]:
        x = random_input(shape, torch.float64, device, rng, name)
        dy = torch.randn(shape, generator=rng, dtype=torch.float64).to(device)
        for reverse in (False, True):
            check(name, x, dim, reverse)
            torch.testing.assert_close(our_grad(name, x, dim, reverse, dy).cpu(),
                                       reference_grad(name, x, dim, reverse, dy))
    s = torch.tensor(1.5, dtype=torch.float64, device=device)
    for dim in (0, -1):
        check(name, s, dim, False)
        assert our_grad(name, s, dim, False, torch.tensor(2.0, dtype=torch.float64, device=device)).item() == 2.0


@pytest.mark.parametrize("name", ALL_OPS)
def test_results_are_contiguous_and_bit_reproducible(device, name, rng):
    # Bit for bit, run to run, on every path (the ticketed ones included),
    # forward and backward.
    for shape, dim, _ in ONE_PER_PATH:
        x = random_input(shape, torch.float32, device, rng, name)
        dy = torch.randn(shape, generator=rng).to(device)
        runs = []
        for _ in range(2):
            out = ours(name, x, dim)
            out = out if isinstance(out, tuple) else (out,)
            runs.append(out + (our_grad(name, x, dim, False, dy),))
        for u, w in zip(*runs):
            assert u.is_contiguous()
            assert torch.equal(u.view(torch.int32) if u.dtype == torch.float32 else u,
                               w.view(torch.int32) if w.dtype == torch.float32 else w)


def test_named_results(device):
    x = torch.tensor([1.0, 3.0, 2.0], device=device)
    r = bt.cummax(x, 0)
    assert isinstance(r, torch.return_types.cummax)
    assert r.indices.tolist() == [0, 1, 1] and r.values.tolist() == [1.0, 3.0, 3.0]
    r = bt.cummin(x, 0, reverse=True)
    assert isinstance(r, torch.return_types.cummin)
    assert r.indices.tolist() == [0, 2, 2]


# ---------------------------------------------------------------- backward


def reference_grad(name, x, dim, reverse, dy):
    """Gradient through torch's op in float64 (the forward reference)."""
    x64 = x.detach().double().cpu().requires_grad_()
    out = reference(name, x64, dim, reverse)
    out = out[0] if name in EXTREME else out
    (g,) = torch.autograd.grad(out, x64, dy.double().cpu())
    return g


def logcumsumexp_grad_slack(x, n):
    """What a logcumsumexp gradient along an axis of n may stray from the
    float64 reference beyond tol: ours goes through y stored in x's dtype,
    off by ~eps |y|, and torch's reference sums the positive and negative
    parts apart, each in the log domain, drifting by up to ~eps |x| n."""
    big = x.abs().max().item()
    return 8 * torch.finfo(x.dtype).eps * big + 4 * torch.finfo(torch.float64).eps * big * n


def our_grad(name, x, dim, reverse, dy):
    x = x.detach().requires_grad_()
    out = ours(name, x, dim, reverse)
    out = out[0] if name in EXTREME else out
    (g,) = torch.autograd.grad(out, x, dy)
    return g


def check_grad(name, x, dim, reverse, dy):
    """Our gradient against the float64 reference through torch's op, in
    x's dtype. cumprod's two-byte backward reads the saved y, rounded, so
    its tolerance is wider."""
    got = our_grad(name, x, dim, reverse, dy)
    ref = reference_grad(name, x, dim, reverse, dy)
    assert got.dtype == x.dtype
    t = tol(x.dtype, x.shape[dim])
    if name == "cumprod" and x.dtype in (torch.float16, torch.bfloat16):
        t = dict(atol=t["atol"] * 4, rtol=t["rtol"] * 4)
    torch.testing.assert_close(got.double().cpu(), ref.cpu(), **t)


# float64 runs the float32 backward's code in the wider type: with float16,
# the slow tier of this sweep (about 80 s of it on an H200).
@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, marks=pytest.mark.slow),
                                   torch.bfloat16, torch.float32,
                                   pytest.param(torch.float64, marks=pytest.mark.slow)], ids=str)
@pytest.mark.parametrize("name", ALL_OPS)
def test_backward_every_dtype(device, dtype, name, rng):
    for shape, dim in [((4, 37, 6), 1), ((4, 37, 6), -1), ((4, 37, 6), 0)] + \
            [(s, d) for s, d, _ in ONE_PER_PATH]:
        x = random_input(shape, dtype, device, rng, name)
        if name == "logcumsumexp":  # no ties: torch's reference itself is smooth there
            x = torch.randn(shape, generator=rng).to(dtype).to(device)
        dy = torch.randn(shape, generator=rng).to(dtype).to(device)
        for reverse in (False, True):
            check_grad(name, x, dim, reverse, dy)


# On CPU the lines (rows, or columns along a middle axis) go to torch's
# intra-op threads in runs of whole lines: with two or three threads the
# 120 lines of 5000 (3 outer indices of 40 columns) and the 64 rows of 3000
# split into runs, some starting or ending inside an outer index. Forward
# and backward must match the float64 reference and be bit-identical to one
# thread's results.
@pytest.mark.parametrize("name", ALL_OPS)
def test_host_lines_across_threads(name, rng):
    before = torch.get_num_threads()
    try:
        for shape, dim in [((3, 5000, 40), 1), ((64, 3000), -1)]:
            x = random_input(shape, torch.float32, "cpu", rng, name)
            if name == "logcumsumexp":  # no ties: torch's reference itself is smooth there
                x = torch.randn(shape, generator=rng)
            dy = torch.randn(shape, generator=rng)
            for reverse in (False, True):
                results = []
                for threads in (1, 2, 3):
                    torch.set_num_threads(threads)
                    results.append(outputs(ours(name, x, dim, reverse)) +
                                   (our_grad(name, x, dim, reverse, dy),))
                for got in results[1:]:
                    for a, b in zip(got, results[0]):
                        assert torch.equal(a, b)
                check(name, x, dim, reverse)
                check_grad(name, x, dim, reverse, dy)
    finally:
        torch.set_num_threads(before)


def check_forward_and_grad_on_path(name, dtype, device, rng, cases, path):
    """Forward and backward, both directions, of every (shape, dim) of
    `cases`, each of which takes `path` on CUDA."""
    for shape, dim in cases:
        assert bt.scan_path(torch.empty(shape, device="meta"), dim) == path
        x = random_input(shape, dtype, device, rng, name)
        if name == "logcumsumexp":  # no ties: torch's reference itself is smooth there
            x = torch.randn(shape, generator=rng).to(dtype).to(device)
        dy = torch.randn(shape, generator=rng).to(dtype).to(device)
        for reverse in (False, True):
            check(name, x, dim, reverse)
            check_grad(name, x, dim, reverse, dy)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ALL_OPS)
def test_strip_tiles_every_dtype(device, dtype, name, rng):
    # On CUDA, a block per strip step; the step's length, hence the tiles
    # a strip has, depends on the op and dtype: a ragged last strip, a short
    # last tile, several outer indices.
    check_forward_and_grad_on_path(name, dtype, device, rng,
                                   [((700, 100), 0), ((3, 500, 64), 1), ((33, 2, 70), 0)],
                                   "strip_tiles")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ALL_OPS)
def test_strip_tiles_long_tiles(device, dtype, name, rng):
    # On CUDA, tiles of twice a strip step's positions where there are at
    # least three for every two SMs (scan_strip_tiles.cuh): 32 strips, the
    # last of 26 columns, and at least eight long tiles a strip, the last
    # short, for every op that takes them on GPUs of up to 170 SMs. The
    # host engine has no tiles, so this runs on CUDA only.
    if device.type != "cuda":
        pytest.skip("long strip tiles are a CUDA path")
    check_forward_and_grad_on_path(name, dtype, device, rng, [((4, 4001, 250), 1)],
                                   "strip_tiles")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ALL_OPS)
def test_column_tiles_few_and_many_columns(device, dtype, name, rng):
    # On CUDA, column_tiles reads a tile's prefix eight totals at a time
    # with fewer than 1024 columns and one at a time with more: both, with
    # several tile groups and a ragged last tile.
    check_forward_and_grad_on_path(name, dtype, device, rng,
                                   [((1100, 7), 0), ((1100, 3, 5), 0), ((32, 530, 33), 1)],
                                   "column_tiles")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ALL_OPS)
def test_row_groups_backward_across_chunks(device, dtype, name, rng):
    # On CUDA, a warp walks rows longer than its lanes hold (32 lanes of 16
    # bytes: 64 float64, 128 float32, 256 bfloat16 elements a chunk) chunk by
    # chunk; cumprod's zeros sit on either side of the chunk edges, where its
    # backward reads a neighbour.
    chunk = 32 * 16 // torch.empty((), dtype=dtype).element_size()
    for shape in [(33, 1000), (9, chunk + 1), (5, 4 * chunk - 3)]:
        assert bt.scan_path(torch.empty(shape, device="meta"), -1) == "row_groups"
        x = random_input(shape, dtype, "cpu", rng, name)
        if name == "logcumsumexp":
            x = torch.randn(shape, generator=rng).to(dtype)
        if name == "cumprod":
            for row, at in enumerate([chunk - 1, chunk, 2 * chunk - 1]):
                if at < shape[1]:
                    x[row % shape[0], at] = 0
        dy = torch.randn(shape, generator=rng).to(dtype)
        x, dy = x.to(device), dy.to(device)
        for reverse in (False, True):
            check_grad(name, x, -1, reverse, dy)


def off_boundary(t, k=1):
    """The same values, contiguous, starting k elements past where an
    allocation (16-byte aligned) starts."""
    flat = torch.empty(t.numel() + k, dtype=t.dtype, device=t.device)
    flat[k:] = t.reshape(-1)
    return flat[k:].view(t.shape)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ALL_OPS)
def test_row_groups_vector_and_element_runs(device, dtype, name, rng):
    # On CUDA, a row_groups lane moves its 16 bytes as vectors where its row
    # is 16-byte aligned, element by element where not (and where its run
    # crosses the row's end); cummax / cummin forward store through a warp
    # exchange either way, their backward brings states (four- and
    # eight-byte types) or indices (two-byte) through one. Rows all aligned,
    # every other one, none; several rows a warp and a warp a row; forward
    # and backward.
    items = 16 // torch.empty((), dtype=dtype).element_size()
    cases = [((37, 8 * items), False),  # four rows a warp, all aligned
             ((37, 8 * items + items // 2), False),  # every other row aligned
             ((37, 8 * items), True),          # none aligned
             ((9, 32 * items * 3 + items), False),  # a warp a row, a last chunk of one lane
             ((9, 32 * items * 3 + items), True)]
    for shape, off in cases:
        assert bt.scan_path(torch.empty(shape, device="meta"), -1) == "row_groups"
        x = random_input(shape, dtype, device, rng, name)
        if name == "logcumsumexp":
            x = torch.randn(shape, generator=rng).to(dtype).to(device)
        dy = torch.randn(shape, generator=rng).to(dtype).to(device)
        if off:
            x, dy = off_boundary(x), off_boundary(dy)
        for reverse in (False, True):
            check(name, x, -1, reverse)
            check_grad(name, x, -1, reverse, dy)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", ALL_OPS)
def test_strips_staged_and_through_registers(device, dtype, name, rng):
    # CUDA strips of bf16 (and of logcumsumexp) copy their inputs into shared
    # memory where each is 16-byte aligned and a row is whole 16-byte pieces
    # of it; otherwise they load through registers. Both ways, forward and
    # backward, each output allocated over NaN so that an element left
    # unwritten shows.
    cases = [((40, 8200), 0, False),    # staged
             ((8, 50, 1001), 1, False),  # rows of 1001 elements
             ((40, 8200), 0, True)]     # inputs off a 16-byte boundary
    if device.type == "cuda":
        # More than one step of 256 positions, the last one partial; a
        # block's second strip past the last column.
        cases.append(((2, 300, 4104), 1, False))
        # 128 strips: no more than the SMs of a large GPU, where two-byte
        # ops walk one strip a block rather than two.
        cases.append(((2, 300, 2048), 1, False))
    for shape, dim, off in cases:
        assert bt.scan_path(torch.empty(shape, device="meta"), dim) == "column_strips"
        x = random_input(shape, dtype, device, rng, name)
        if name == "logcumsumexp":  # as in test_backward_every_dtype
            x = torch.randn(shape, generator=rng).to(dtype).to(device)
        dy = torch.randn(shape, generator=rng).to(dtype).to(device)
        if off:
            x, dy = off_boundary(x), off_boundary(dy)
        for reverse in (False, True):
            poison_allocator(x.device, 2 * x.numel())
            check(name, x, dim, reverse)
            poison_allocator(x.device, 2 * x.numel())
            check_grad(name, x, dim, reverse, dy)


def naive_cumprod_grad(x, dy):
    """dx_i = sum_{j>=i} dy_j prod_{k<=j, k!=i} x_k, 1-D, float64, no division."""
    n = x.numel()
    dx = torch.zeros(n, dtype=torch.float64)
    for i in range(n):
        for j in range(i, n):
            p = dy[j].item()
            for k in range(j + 1):
                if k != i:
                    p *= x[k].item()
            dx[i] += p
    return dx


@pytest.mark.parametrize("zeros", [[3], [2, 5], [0, 1, 7], [7]])
def test_cumprod_backward_exact_with_zeros(device, zeros):
    g = torch.Generator().manual_seed(len(zeros))
    x = torch.randn(8, generator=g, dtype=torch.float64)
    x[zeros] = 0.0
    dy = torch.randn(8, generator=g, dtype=torch.float64)
    want = naive_cumprod_grad(x, dy)
    got = our_grad("cumprod", x.to(device), 0, False, dy.to(device)).cpu()
    torch.testing.assert_close(got, want, atol=1e-14, rtol=1e-13)
    got_rev = our_grad("cumprod", x.flip(0).to(device), 0, True, dy.flip(0).to(device)).cpu()
    torch.testing.assert_close(got_rev.flip(0), want, atol=1e-14, rtol=1e-13)
    # Past the first zero every term holds that zero: exactly 0, not NaN.
    assert (got[zeros[0] + 1:] == 0).all()
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_cumprod_backward_across_chunk_edges(device, dtype, rng):
    # Rows of four 2048-element chunks (CUDA rows path): the middle chunks
    # skip cumprod backward's tests of the axis ends and read their
    # neighbours across chunk edges, where the zeros sit.
    shape = (256, 4 * 2048 - 100)  # enough rows for the rows path
    assert bt.scan_path(torch.empty(shape, device="meta"), -1) == "rows"
    x = (1 + 1e-3 * torch.randn(shape, generator=rng, dtype=torch.float64)).to(dtype)
    for row, at in enumerate([2047, 2048, 4095, 4096]):
        x[row, at] = 0.0
    x, dy = x.to(device), torch.randn(shape, generator=rng).to(dtype).to(device)
    for reverse in (False, True):
        got = our_grad("cumprod", x, -1, reverse, dy)
        ref = reference_grad("cumprod", x, -1, reverse, dy)
        # Gradients reach ~sqrt(len): the error is relative to the largest.
        t = tol(dtype, shape[-1])
        torch.testing.assert_close(got.double().cpu(), ref, rtol=t["rtol"],
                                   atol=t["rtol"] * ref.abs().max().item())
        assert torch.isfinite(got).all()


def test_logcumsumexp_neg_inf_prefix_and_large_magnitudes(device):
    x = torch.tensor([[-INF, -INF, 0.5, -INF, 2.0], [1e4, -1e4, 1e4, 3.0, -1e4]],
                     dtype=torch.float64, device=device)
    for dtype in (torch.float32, torch.float64):
        xi = x.to(dtype).requires_grad_()
        y = bt.logcumsumexp(xi, 1)
        assert torch.isneginf(y[0, :2]).all() and torch.isfinite(y[0, 2:]).all()
        assert torch.isfinite(y[1]).all()
        torch.testing.assert_close(y.double(), torch.logcumsumexp(x, 1).to(dtype).double())
        dy = torch.tensor([[1.0, -2.0, 0.5, 1.5, -1.0], [0.3, -0.7, 1.1, 2.0, -0.4]],
                          dtype=dtype, device=device)
        (g,) = torch.autograd.grad(y, xi, dy)
        assert torch.isfinite(g).all()
        assert (g[0, :2] == 0).all() and g[0, 3] == 0
        # float64 reference of sum_{j>=i} dy_j exp(x_i - y_j) over finite terms.
        y64 = torch.logcumsumexp(x, 1)
        for r in range(2):
            for i in range(5):
                if math.isinf(x[r, i].item()):
                    continue
                want = sum(dy[r, j].item() * math.exp(x[r, i].item() - y64[r, j].item())
                           for j in range(i, 5))
                # y is stored in dtype: at 1e4 float32 rounds it by ~5e-4.
                rel = 1e-3 if dtype == torch.float32 else 1e-10
                assert abs(g[r, i].item() - want) <= rel * max(1.0, abs(want))
    # All -inf: -inf forward, zero gradient.
    z = torch.full((3, 4), -INF, device=device, requires_grad=True)
    y = bt.logcumsumexp(z, 1, reverse=True)
    assert torch.isneginf(y).all()
    (g,) = torch.autograd.grad(y.sum(), z)
    assert (g == 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape,dim,path", ONE_PER_PATH, ids=lambda v: str(v))
def test_logcumsumexp_wide_spans_and_neg_inf_stretches(device, dtype, shape, dim, path, rng):
    # On CUDA a thread's run, and a warp's run totals, are scanned against
    # their largest value where all are finite and within 64 of it, and by
    # joins otherwise. A steep trend makes short runs tame and their totals
    # wild; wide noise makes runs wild; stretches of -inf (the first one an
    # all -inf prefix) send runs and totals to the joins. A first element far
    # below the rest makes the first run wild while the warps' totals stay
    # close (folded against their largest, an empty prefix first).
    n = shape[dim]
    pos = torch.arange(n, dtype=torch.float64).reshape([n if d == dim % len(shape) else 1
                                                        for d in range(len(shape))])
    noise = torch.randn(shape, generator=rng, dtype=torch.float64)
    inputs = {"trend": (pos % 1000) + noise, "wide": 40.0 * noise,
              "neg_inf": torch.where((pos // 300) % 2 == 0, -INF, noise),
              "far_first": torch.where((pos == 0) | (pos == n - 1), noise - 1000.0, noise)}
    for kind, x in inputs.items():
        x = x.to(dtype).to(device)
        dy = torch.randn(shape, generator=rng).to(dtype).to(device)
        for reverse in (False, True):
            check("logcumsumexp", x, dim, reverse)
            got = our_grad("logcumsumexp", x, dim, reverse, dy)
            assert torch.isfinite(got).all(), kind
            if kind == "neg_inf":
                # torch's own gradient is NaN at -inf inputs; ours is 0.
                assert (got[torch.isneginf(x)] == 0).all()
                continue
            ref = reference_grad("logcumsumexp", x, dim, reverse, dy)
            slack = logcumsumexp_grad_slack(x, n)
            t = tol(dtype, n)
            torch.testing.assert_close(got.double().cpu(), ref.cpu(), atol=t["atol"] + slack,
                                       rtol=t["rtol"] + slack)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape,dim,path", ONE_PER_PATH, ids=lambda v: str(v))
def test_logcumsumexp_masked_stretches(device, dtype, shape, dim, path, rng):
    # On CUDA a thread's run of -inf alone adds nothing: its total is the
    # identity and each result the prefix's, without the joins; a run that
    # starts with -inf is weighed from its first element that is not.
    # Stretches of -inf, the first an all -inf prefix; then stretches after
    # a +inf (each result +inf) and one holding a NaN (not all -inf: it
    # takes the joins, and every later result is NaN).
    n = shape[dim]
    s = max(1, min(300, n // 6))
    pos = torch.arange(n).reshape([n if d == dim % len(shape) else 1 for d in range(len(shape))])
    noise = torch.randn(shape, generator=rng, dtype=torch.float64)
    stretches = torch.where((pos // s) % 2 == 0, -INF, noise)
    specials = torch.where((pos // s) % 2 == 1, -INF, noise)
    specials = torch.where(pos == s // 2, INF, specials)
    specials = torch.where(pos == 3 * s + s // 2, NAN, specials)
    # Stretches at -100 and 100 in turn between the -inf: a stretch ending
    # inside a run, where the values after it lie far above the prefix
    # (e^-200 of it underflows in any float type).
    level = torch.where((pos // (2 * s)) % 2 == 0, -100.0, 100.0)
    steps = torch.where((pos // s) % 2 == 1, -INF, noise + level)
    for x in (stretches, specials, steps):
        x = x.to(dtype).to(device)
        for reverse in (False, True):
            check("logcumsumexp", x, dim, reverse)


@pytest.mark.parametrize("shape,dim,path", ONE_PER_PATH, ids=lambda v: str(v))
def test_logcumsumexp_float32_rising_runs_near_zero(device, shape, dim, path):
    # On CUDA a float32 run's weights exp(x - hi) skip exp's correction term
    # where the run's first element lies within 8 of its largest, and keep
    # it further below (for_each_run_weight, scan_ops.h). Rows rising from 0
    # at several slopes put the first runs on both sides of that line while
    # y stays near 0, where an error in a weight shows in full. There y is
    # top + log(S) with log(S) as low as -64, rounded before top is added:
    # 64 * 2^-24 = 3.8e-6 of the run's own making, whatever the weights.
    n = shape[dim]
    d = dim % len(shape)
    pos = torch.arange(n, dtype=torch.float64).reshape([n if k == d else 1
                                                        for k in range(len(shape))])
    rows = torch.arange(math.prod(shape) // n, dtype=torch.float64)
    slopes = torch.tensor([2.0, 0.25, 1.0, 0.5, 4.0, 0.05], dtype=torch.float64)
    slope = slopes[rows.long() % len(slopes)].reshape(
        [s for k, s in enumerate(shape) if k != d]).unsqueeze(d)
    x = (slope * (pos % 40)).to(torch.float32).to(device)
    for reverse in (False, True):
        got = bt.logcumsumexp(x, dim, reverse=reverse).double().cpu()
        ref = reference("logcumsumexp", x, dim, reverse)
        err = ((got - ref).abs() / ref.abs().clamp(min=1.0)).max().item()
        assert err <= 5e-6, (path, reverse, err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape,dim,path", ONE_PER_PATH, ids=lambda v: str(v))
def test_logcumsumexp_nan_and_inf_inside_runs(device, dtype, shape, dim, path, rng):
    # On CUDA a thread's run is scanned against its largest element where
    # that is finite and the first element within 64 of it: a -inf or a NaN
    # further in stays on that path, where the -inf weighs 0 and the NaN
    # turns every later result NaN. A +inf, or any of them first, sends the
    # run to the joins. Sparse, so most runs hold one at most.
    n = shape[dim]
    pos = torch.arange(n).reshape([n if d == dim % len(shape) else 1 for d in range(len(shape))])
    x = torch.randn(shape, generator=rng, dtype=torch.float64)
    for value, every, at in [(-INF, 29, 3), (NAN, 997, 5), (INF, 1999, 11), (-INF, 3001, 0)]:
        x = torch.where(pos % every == at, value, x)
    x = x.to(dtype).to(device)
    for reverse in (False, True):
        check("logcumsumexp", x, dim, reverse)


# On CUDA, two-byte logcumsumexp rows that move as whole 16-byte runs go a
# warp per row where there are rows enough to give every resident warp one
# (scan_warp_rows.cuh): 8448 rows make two full rounds of 32 warps on each
# of 132 SMs, and on 108 SMs 2.4 rounds, over three quarters of three. A
# row of 264 is one chunk of 256 and a ragged one; shifted off a 16-byte
# boundary, the rows go to the row-group kernel (the path's other kernel).
WARP_ROWS = (8448, 264)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_logcumsumexp_two_byte_rows_a_warp_each(device, dtype, rng):
    assert bt.scan_path(torch.empty(WARP_ROWS, device="meta"), -1) == "row_groups"
    n = WARP_ROWS[1]
    pos = torch.arange(n, dtype=torch.float64)
    noise = torch.randn(WARP_ROWS, generator=rng, dtype=torch.float64)
    # Plain noise keeps the lanes' totals within 64 of the largest (summed
    # by reference); a trend spreads them (joined); wide noise makes runs
    # wild; a far first element leaves a lane's prefix empty.
    inputs = {"noise": noise, "trend": pos + noise, "wide": 40.0 * noise,
              "far_first": torch.where(pos == 0, noise - 1000.0, noise)}
    for kind, x in inputs.items():
        x = x.to(dtype).to(device)
        dy = torch.randn(WARP_ROWS, generator=rng).to(dtype).to(device)
        for xs in (x, off_boundary(x)):
            for reverse in (False, True):
                check("logcumsumexp", xs, -1, reverse)
        if kind == "noise":  # elsewhere y's rounding swamps the gradient's tolerance
            check_grad_along_rows("logcumsumexp", x, dy)


# Two-byte rows of odd length on the rows path (several chunks) and on
# long_rows, for the kernels that move whole 16-byte runs.
TWO_BYTE_ROWS = [((256, 2100), "rows"), ((512, 4101), "rows"), ((3, 20011), "long_rows")]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", EXTREME)
def test_extreme_forward_two_byte_rows_loaded_whole(device, dtype, name, rng):
    # On CUDA, rows whose runs of eight two-byte elements lie on 16-byte
    # boundaries (each direction has its own anchor) are read a vector per
    # run, the next chunk's ahead of the scan; other rows, and runs that cross
    # the end, element by element. Rows of odd length alternate between the
    # two (off_boundary shifts which), and NaN must still win as torch's does.
    for shape, path in TWO_BYTE_ROWS:
        assert bt.scan_path(torch.empty(shape, device="meta"), -1) == path
        x = random_input(shape, dtype, "cpu", rng, name)
        x.view(-1)[torch.randint(0, x.numel(), (20,), generator=rng)] = NAN
        x = x.to(device)
        for reverse in (False, True):
            check(name, x, -1, reverse)
            check(name, off_boundary(x), -1, reverse)


def check_grad_along_rows(name, x, dy):
    """Our gradient along dim -1 against the float64 reference, both ways, on
    the inputs as given and with x or dy moved off a 16-byte boundary."""
    for reverse in (False, True):
        for xs, dys in [(x, dy), (off_boundary(x), dy), (x, off_boundary(dy))]:
            got = our_grad(name, xs, -1, reverse, dys)
            ref = reference_grad(name, xs, -1, reverse, dys)
            torch.testing.assert_close(got.double().cpu(), ref.cpu(), **tol(x.dtype, x.shape[-1]))


# About 35 s on an H200: the slow tier. The cumprod test below keeps the
# same vectorised row moves in the quick tier.
@pytest.mark.slow
@pytest.mark.parametrize("dtype", BFLOAT16_QUICK, ids=str)
def test_logcumsumexp_backward_two_byte_rows_moved_whole(device, dtype, rng):
    # On CUDA, where dy, x, y and dx all lie on 16-byte boundaries, each run
    # of eight is read and written as one vector per array, the rows kernel
    # fetching the next chunk's ahead; the other rows, and runs that cross
    # the end, go element by element.
    for shape, _ in TWO_BYTE_ROWS:
        x = torch.randn(shape, generator=rng).to(dtype).to(device)
        dy = torch.randn(shape, generator=rng).to(dtype).to(device)
        check_grad_along_rows("logcumsumexp", x, dy)


@pytest.mark.parametrize("dtype", BFLOAT16_QUICK, ids=str)
def test_cumprod_backward_two_byte_rows_moved_whole(device, dtype, rng):
    # On CUDA, aligned rows move runs of eight of dy, x, y and dx as vectors;
    # cumprod backward also reads x one scan position before each element and
    # y one after, which at a run's ends lie in the neighbouring runs. Zeros
    # straddle a run boundary mid-row: the gradient stays exact on both sides
    # of them, in either direction.
    for shape, _ in TWO_BYTE_ROWS:
        x = 1 + 0.05 * torch.randn(shape, generator=rng, dtype=torch.float64)
        mid = shape[-1] // 16 * 8
        x[:, [mid - 1, mid, mid + 31]] = 0
        x = x.to(dtype).to(device)
        dy = torch.randn(shape, generator=rng).to(dtype).to(device)
        check_grad_along_rows("cumprod", x, dy)


# long_rows on CUDA cuts each row into tiles whose totals later tiles fold;
# two-byte rows move whole 16-byte runs only where the row lies on a 16-byte
# boundary at the scan direction's anchor (its first element forward, one
# past its last in reverse). These lengths and shifts (elements past an
# aligned start) give each direction aligned and shifted rows, a ragged last
# tile at either end of a row, and several rows in one launch.
# Tiles are one, two or three chunks of 2048 (the op decides,
# scan_launch.cuh): rows of 41000 end 40 elements into a chunk, so a last
# tile of two chunks has its second wholly past the end.
LONG_ROW_LAYOUTS = [((1, 40000), 0), ((1, 40000), 1), ((1, 40003), 0), ((1, 40003), 3),
                    ((3, 20000), 0), ((3, 20001), 0), ((2, 41000), 1)]


@pytest.mark.parametrize("dtype", float32_quick([torch.bfloat16, torch.float32, torch.float64]),
                         ids=str)
# The long-row kernels are templates over the op: cumsum and cummax run them
# in the quick tier, cumprod, cummin and logcumsumexp (its own long-row tests
# below are quick) in the slow one.
@pytest.mark.parametrize("name", [n if n not in ("cumprod", "cummin", "logcumsumexp") else
                                  pytest.param(n, marks=pytest.mark.slow) for n in ALL_OPS])
def test_long_rows_layouts_and_ragged_tiles(device, dtype, name, rng):
    for shape, k in LONG_ROW_LAYOUTS:
        assert bt.scan_path(torch.empty(shape, device="meta"), -1) == "long_rows"
        if name == "cumprod":
            # Factors near 1 (products stay in range over 40000 of them), and
            # zeros on both sides of chunk and tile edges and at the row's
            # ends: the backward reads x and y one position past its own.
            x = 1 + 0.01 * torch.randn(shape, generator=rng, dtype=torch.float64)
            x[:, [0, 2047, 2048, 4095, 4096, 6143, 6144, 8191, 8192, shape[-1] - 1]] = 0
            x = x.to(dtype)
        else:
            x = random_input(shape, dtype, "cpu", rng, name)
        x = off_boundary(x.to(device), k)
        dy = off_boundary(torch.randn(shape, generator=rng).to(dtype).to(device), k)
        for reverse in (False, True):
            check(name, x, -1, reverse)
            got = our_grad(name, x, -1, reverse, dy)
            ref = reference_grad(name, x, -1, reverse, dy)
            torch.testing.assert_close(got.double().cpu(), ref.cpu(), **tol(dtype, shape[-1]))


@pytest.mark.parametrize("name", EXTREME)
def test_extreme_backward_goes_to_forward_index(device, name, rng):
    x = torch.tensor([[1.0, 3.0, 3.0, NAN, 5.0, NAN], [2.0, 2.0, 2.0, 1.0, 4.0, 4.0]],
                     dtype=torch.float32, device=device)
    dy = torch.arange(1.0, 13.0, device=device).reshape(2, 6)
    for reverse in (False, True):
        _, idx = ours(name, x, 1, reverse)
        want = torch.zeros(2, 6, device=device).scatter_add(1, idx, dy)
        assert torch.equal(our_grad(name, x, 1, reverse, dy), want)
        assert torch.equal(reference(name, x, 1, reverse)[1].to(device), idx)


@pytest.mark.parametrize("name", ALL_OPS)
def test_graph_recorded_only_when_needed(device, name, rng):
    """The forward ops' autograd (C++): a node only where grad mode is on and
    x requires grad; cummax / cummin indices never require grad; the values'
    gradient alone flows back, also when part of a larger graph."""
    x = torch.randn(4, 6, generator=rng).to(device)
    xg = x.clone().requires_grad_()
    plain = ours(name, x, 1)
    with torch.no_grad():
        no_grad = ours(name, xg, 1)
    with torch.inference_mode():
        inference = ours(name, x.clone(), 1)
    graphed = ours(name, xg, 1)
    for out in (plain, no_grad, inference):
        for t in outputs(out):
            assert t.grad_fn is None and not t.requires_grad
    values = graphed[0] if name in EXTREME else graphed
    assert values.grad_fn is not None and values.requires_grad
    if name in EXTREME:
        assert not graphed[1].requires_grad
    torch.testing.assert_close(values.detach(), plain[0] if name in EXTREME else plain)
    dy = torch.randn(4, 6, generator=rng).to(device)
    (values * dy).sum().backward()
    torch.testing.assert_close(xg.grad, our_grad(name, x, 1, False, dy))


def _scan_backward_inputs(name, x, dim):
    """scan_backward's saved tensors for `name` on `x`: (x, y, indices)."""
    if name in EXTREME:
        return None, None, ours(name, x, dim)[1]
    if name == "cumsum":
        return None, None, None
    return x, ours(name, x, dim), None


@pytest.mark.parametrize("name", ALL_OPS)
def test_scan_backward_graph_recorded_only_when_needed(device, name, rng):
    """scan_backward's autograd (C++): a node only where grad mode is on and
    grad, x or y requires grad; then its gradient is the double backward."""
    op = torch.ops.baracuda.scan_backward.default
    x = torch.randn(3, 5, generator=rng, dtype=torch.float64).to(device) + 2
    dy = torch.randn(3, 5, generator=rng, dtype=torch.float64).to(device)
    sx, sy, idx = _scan_backward_inputs(name, x, 1)
    plain = op(dy, sx, sy, idx, 1, name, False)
    with torch.no_grad():
        no_grad = op(dy.clone().requires_grad_(), sx, sy, idx, 1, name, False)
    assert plain.grad_fn is None and no_grad.grad_fn is None and not no_grad.requires_grad
    dyg = dy.clone().requires_grad_()
    graphed = op(dyg, sx, sy, idx, 1, name, False)
    assert graphed.grad_fn is not None
    torch.testing.assert_close(graphed.detach(), plain)
    # Linear in dy: its gradient along gg is the backward's transpose.
    gg = torch.randn(3, 5, generator=rng, dtype=torch.float64).to(device)
    (got,) = torch.autograd.grad(graphed, dyg, gg)
    eps = torch.randn(3, 5, generator=rng, dtype=torch.float64).to(device)
    lhs = (op(eps, sx, sy, idx, 1, name, False) * gg).sum()
    torch.testing.assert_close((eps * got).sum(), lhs)


@pytest.mark.parametrize("name", ["cumprod", "logcumsumexp"])
def test_triple_backward(device, name, rng):
    """The double backward is built of differentiable ops: third derivatives
    check out too."""
    x = torch.randn(5, generator=rng, dtype=torch.float64).to(device)
    x = (x + torch.sign(x) * 0.5).requires_grad_()
    dy = torch.randn(5, generator=rng, dtype=torch.float64).to(device)

    def first_derivative(t):
        (g,) = torch.autograd.grad(ours(name, t, 0), t, dy, create_graph=True)
        return g

    assert torch.autograd.gradgradcheck(first_derivative, (x,))


@pytest.mark.parametrize("name", ALL_OPS)
@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck_and_gradgradcheck(device, name, reverse, rng):
    for shape, dim in [((6,), 0), ((3, 5, 2), 1), ((4, 3), 0), ((), 0)]:
        x = torch.randn(shape, generator=rng, dtype=torch.float64).to(device).requires_grad_()
        if name == "cumprod" and x.dim():
            x = (x.detach() + torch.sign(x.detach()) * 0.5).requires_grad_()

        def fn(t):
            out = ours(name, t, dim, reverse)
            return out[0] if name in EXTREME else out

        assert torch.autograd.gradcheck(fn, (x,))
        assert torch.autograd.gradgradcheck(fn, (x,))


def test_cumprod_double_backward_with_zeros(device):
    x = torch.tensor([[1.5, 0.0, -2.0, 0.7], [0.0, 0.0, 1.2, -0.8]], dtype=torch.float64,
                     device=device, requires_grad=True)
    for reverse in (False, True):
        assert torch.autograd.gradgradcheck(lambda t: bt.cumprod(t, 1, reverse=reverse), (x,))


def test_deterministic_mode_runs_every_backward(device, rng):
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for name in ALL_OPS:
            for shape, dim, _ in ONE_PER_PATH:
                x = random_input(shape, torch.float32, device, rng, name).requires_grad_()
                dy = torch.randn(shape, generator=rng).to(device)
                a = our_grad(name, x, dim, False, dy)
                b = our_grad(name, x, dim, False, dy)
                assert torch.equal(a, b)
    finally:
        torch.use_deterministic_algorithms(prev)


# ---------------------------------------------------------------- opcheck / compile


def test_opcheck(device, rng):
    ops = torch.ops.baracuda
    x = torch.randn(3, 7, 2, generator=rng).to(device)
    dy = torch.randn(3, 7, 2, generator=rng).to(device)
    for name in ALL_OPS:
        for dim, reverse in ((1, False), (-1, True), (0, False)):
            opcheck(getattr(ops, name).default, (x.clone().requires_grad_(), dim, reverse))
    y = bt.cumprod(x, 1)
    _, idx = bt.cummax(x, 1)
    for kind in PLAIN:
        opcheck(ops.scan_backward.default, (dy, x, bt.cumprod(x, 1) if kind == "cumprod"
                                            else bt.logcumsumexp(x, 1), None, 1, kind, False))
    opcheck(ops.scan_backward.default, (dy, None, None, idx, 1, "cummax", False))
    opcheck(ops.scan_backward.default, (dy.double(), x.double(), y.double(), None, 1, "cumprod", True))


def test_compile_fullgraph_dynamic_no_recompile(device, rng):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def f(x):
        out = bt.cumsum(x, -1) + bt.cumprod(x, 0, reverse=True) + bt.logcumsumexp(x, 1)
        out = out + bt.cummax(x, -1).values + bt.cummin(x, 0, reverse=True)[0]
        return out.sum()

    compiled = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        x = torch.randn(rows, 6, generator=rng).to(device).requires_grad_()
        out = compiled(x)
        torch.testing.assert_close(out, f(x))
        (g,) = torch.autograd.grad(out, x)
        (g_eager,) = torch.autograd.grad(f(x), x)
        torch.testing.assert_close(g, g_eager)
    assert counter.frame_count == 1


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("name", ALL_OPS)
def test_errors_name_op_and_value(device, name):
    op = getattr(torch.ops.baracuda, name)
    # Integer and bool inputs: test_integer_dtype_errors_name_op_and_dtype.
    for dtype in (torch.complex64, torch.complex128):
        with pytest.raises(RuntimeError, match=rf"baracuda::{name}: x.dtype=\w+ is not supported"):
            op(torch.ones(3, dtype=dtype, device=device), 0)
    with pytest.raises(RuntimeError, match=rf"baracuda::{name}: dim=5 out of range for a rank-2"):
        op(torch.ones(2, 3, device=device), 5)
    with pytest.raises(RuntimeError, match=rf"baracuda::{name}: dim=-3 out of range"):
        op(torch.ones(2, 3, device=device), -3)
    with pytest.raises(RuntimeError, match="out of range for a rank-0"):
        op(torch.tensor(1.0, device=device), 1)


def test_scan_backward_errors(device):
    ops = torch.ops.baracuda
    g = torch.ones(2, 3, device=device)
    with pytest.raises(RuntimeError, match="kind='cumfoo' must be one of"):
        ops.scan_backward(g, None, None, None, 1, "cumfoo", False)
    with pytest.raises(RuntimeError, match="kind='cumprod' needs the saved forward tensor x"):
        ops.scan_backward(g, None, g, None, 1, "cumprod", False)
    with pytest.raises(RuntimeError, match=r"y.shape=\[2, 2\] must equal grad.shape=\[2, 3\]"):
        ops.scan_backward(g, g, torch.ones(2, 2, device=device), None, 1, "logcumsumexp", False)
    with pytest.raises(RuntimeError, match="indices.dtype=Float must be int64"):
        ops.scan_backward(g, None, None, g, 1, "cummax", False)
    with pytest.raises(RuntimeError, match="x.dtype=Double must equal grad.dtype=Float"):
        ops.scan_backward(g, g.double(), g, None, 1, "cumprod", False)


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ALL_OPS)
def test_tens_of_millions_on_cuda(name):
    n = (1 << 24) + 12345
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(1, n, generator=g, device="cuda")
    if name == "cumprod":
        # A product of 16M factors accumulates float32 rounding far past any
        # fixed tolerance (torch's own float32 cumprod too); float64 checks
        # the same path at this length.
        x = (1 + 1e-4 * x).double()
    assert bt.scan_path(x, 1) == "long_rows"
    for reverse in (False, True):
        got = ours(name, x, 1, reverse)
        ref = reference(name, x, 1, reverse)
        if name in EXTREME:
            assert torch.equal(got[0].double().cpu(), ref[0].cpu())
            assert torch.equal(got[1].cpu(), ref[1].cpu())
        else:
            scale = ref.abs().max().item()
            torch.testing.assert_close(got.double().cpu(), ref.cpu(), atol=1e-5 * max(scale, 1.0),
                                       rtol=1e-4)
        dy = torch.randn(1, n, generator=g, device="cuda").to(x.dtype)
        got_g = our_grad(name, x, 1, reverse, dy)
        assert torch.isfinite(got_g).all()
        if name in ("cumsum",) + tuple(EXTREME):
            ref_g = reference_grad(name, x, 1, reverse, dy)
            torch.testing.assert_close(got_g.double().cpu(), ref_g.cpu(),
                                       atol=1e-5 * max(ref_g.abs().max().item(), 1.0), rtol=1e-4)


# On a CUDA device with the bulk copy engine, cumsum, cumprod and cumsum's
# backward take long rows through staged tiles (scan_staged_rows.cuh) where
# the row starts, and every row's length in bytes, are 16-byte aligned:
# tiles of 16 KiB (2048 float64 to 8192 two-byte elements), walked by
# persistent blocks, each tile's total published for the tiles after it in
# groups of 32. These rows span several groups, end in a ragged tile (and,
# at 70001, in a partial 16-byte vector read from memory), come several to a
# launch, and in reverse meet the ragged tile first. cumprod has zeros on
# tile edges of every element size. Results must also be bit-identical from
# run to run, and the launch must work inside a CUDA graph. cumprod's
# backward stages dy, x and y in tiles of 4096 (scan_staged_cumprod_grad.cuh)
# for float32 and two-byte elements; its every element is written over a
# poisoned allocator.
STAGED_ROWS = [(1, 300000), (1, 70001), (4, 300000), (3, 524288)]


def assert_long_row_grad_close(name, got, x, reverse, dy):
    """Our gradient `got` along dim -1 of long rows against the float64
    reference. float32 cumprod's products and sums of terms near 1 over up
    to 524288 positions round past the fixed per-element tolerance (torch's
    own float32 gradient is off by about 2e-4 in norm there): it must be as
    close as torch's; logcumsumexp takes logcumsumexp_grad_slack."""
    ref = reference_grad(name, x, -1, reverse, dy)
    got = got.double().cpu()
    t = tol(x.dtype, x.shape[-1])
    if name == "cumprod" and x.dtype == torch.float32:
        xt = x.detach().requires_grad_()
        yt = torch.cumprod(xt.flip(-1) if reverse else xt, -1)
        (theirs,) = torch.autograd.grad(yt.flip(-1) if reverse else yt, xt, dy)
        err = lambda g: ((g.double().cpu() - ref).norm() / ref.norm()).item()
        assert err(got) <= 2 * err(theirs) + 1e-6
        return
    if name == "logcumsumexp":
        slack = logcumsumexp_grad_slack(x, x.shape[-1])
        t = dict(atol=t["atol"] + slack, rtol=t["rtol"] + slack)
    torch.testing.assert_close(got, ref, **t)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", float32_quick([torch.float16, torch.bfloat16, torch.float32,
                                                torch.float64]), ids=str)
# cumprod runs cumsum's staged kernel with another op: the slow tier.
@pytest.mark.parametrize("name", ["cumsum", pytest.param("cumprod", marks=pytest.mark.slow)])
def test_staged_long_rows_on_cuda(dtype, name):
    g = torch.Generator().manual_seed(11)
    for shape in STAGED_ROWS:
        assert bt.scan_path(torch.empty(shape, device="meta"), -1) == "long_rows"
        if name == "cumprod":
            # Zeros in the last row, at tile edges of each element size in
            # its middle, so that the products before them (forward) and
            # after them (reverse) stay nonzero.
            x = 1 + 1e-3 * torch.randn(shape, generator=g, dtype=torch.float64)
            mid = shape[1] // 2 // 8192 * 8192
            x[-1, [mid - 1, mid, mid + 2047, mid + 2048, mid + 4095, mid + 4096]] = 0
        else:
            x = torch.randn(shape, generator=g, dtype=torch.float64)
        x = x.to(dtype).cuda()
        dy = torch.randn(shape, generator=g).to(dtype).cuda()
        for reverse in (False, True):
            check(name, x, -1, reverse)
            first = ours(name, x, -1, reverse)
            assert torch.equal(ours(name, x, -1, reverse), first)
            poison_allocator(x.device, x.numel())
            got = our_grad(name, x, -1, reverse, dy)
            assert_long_row_grad_close(name, got, x, reverse, dy)
            assert torch.equal(our_grad(name, x, -1, reverse, dy), got)
            if name == "cumprod" and dtype != torch.float32:
                # The long_rows kernel, on a copy of x off a 16-byte boundary
                # (float32's long products are held to the reference above).
                unstaged = our_grad(name, off_boundary(x), -1, reverse, dy)
                torch.testing.assert_close(got, unstaged, **tol(dtype, shape[1]))


# Rows longer than a staged grid's blocks times its tiles, so that from its
# second round on a block takes its tile's prefix from its own previous
# tile's (LookBack::kStride, scan_staged_rows.cuh), and rounds cross from
# one row to the next. Small integers keep cumsum exact; cummax follows
# torch's values and indices; the gradients of cumprod (zeros included)
# and logcumsumexp match the long_rows kernel on a copy off a 16-byte
# boundary. Results must be bit-identical run to run.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_staged_long_rows_past_one_round_on_cuda(dtype):
    shape = (2, 5_000_003)
    assert bt.scan_path(torch.empty(shape, device="meta"), -1) == "long_rows"
    g = torch.Generator(device="cuda").manual_seed(5)
    ints = torch.randint(-1, 2, shape, generator=g, device="cuda")
    x = ints.to(dtype)
    dy = torch.randint(-1, 2, shape, generator=g, device="cuda").to(dtype)
    near_one = (1 + 1e-3 * torch.randn(shape, generator=g, device="cuda")).to(dtype)
    near_one[1, [7, 4_000_000, 4_000_001]] = 0
    coarse = (torch.randint(-60, 60, shape, generator=g, device="cuda") / 4).to(dtype)
    normal = torch.randn(shape, generator=g, device="cuda").to(dtype)
    for reverse in (False, True):
        def cumsum_of(t):
            return (t.flip(1).cumsum(1).flip(1) if reverse else t.cumsum(1)).to(dtype)
        got = bt.cumsum(x, 1, reverse=reverse)
        assert torch.equal(got, cumsum_of(ints))
        assert torch.equal(bt.cumsum(x, 1, reverse=reverse), got)
        assert torch.equal(our_grad("cumsum", x, -1, reverse, dy),
                           (dy.long().cumsum(1) if reverse
                            else dy.long().flip(1).cumsum(1).flip(1)).to(dtype))
        values, indices = bt.cummax(coarse, 1, reverse=reverse)
        flipped = coarse.flip(1) if reverse else coarse
        ref = torch.cummax(flipped, 1)
        ref_values, ref_indices = (ref.values.flip(1), shape[1] - 1 - ref.indices.flip(1)) \
            if reverse else (ref.values, ref.indices)
        assert torch.equal(values, ref_values) and torch.equal(indices, ref_indices)
        for name, t in (("cumprod", near_one), ("logcumsumexp", normal)):
            got = our_grad(name, t, -1, reverse, dy)
            assert torch.equal(our_grad(name, t, -1, reverse, dy), got)
            unstaged = our_grad(name, off_boundary(t), -1, reverse, dy)
            torch.testing.assert_close(got, unstaged, **tol(dtype, shape[1]))


# logcumsumexp forward on the same long rows: staged, a thread scanning 16
# (float32) or 32 (two-byte) consecutive positions of a tile as one run, on
# compute capability 9.0 and up; float64 takes the long_rows kernel. Rows
# of whole 128-byte lines, with at least a tile for every SM, take swizzled
# stages instead (a thread's run one line: 32 float32 or 64 two-byte
# positions, in tiles of 8192 and 16384): on an H100, [4, 300000] and
# [3, 524288] float32, and [2, 2400128] of every type, whose last tiles are
# short and whose blocks take more than one tile. [2, 1146888],
# [1, 2400056] and [200, 8200] (a tile a row) of every type end in part of
# a line (8, 56 and 8 two-byte positions, 8, 24 and 8 float32), with a large
# element in it, and keep the unswizzled stages, as the others do. In the
# first row an all -inf prefix spans a tile and a bit, a steep stretch makes
# later tiles outgrow the carry, one large element makes the run that
# holds it too wide for its weights (a run scanned join by join), and one
# element 50 above its neighbours gives its run weights near e^50 (two-byte
# runs, weighed against their first element, still take them). Rows
# longer than 140007 hold a masked stretch of -inf whose ends fall inside
# runs, after a prefix in either direction (two-byte runs that start with
# -inf go against their first element that is not). A +inf
# in the second row absorbs what follows it (precedes, reversed), and a NaN
# in the last turns it NaN. Results must be bit-identical run to run.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", float32_quick([torch.float16, torch.bfloat16, torch.float32,
                                                torch.float64]), ids=str)
def test_staged_logcumsumexp_long_rows_on_cuda(dtype):
    g = torch.Generator().manual_seed(19)
    for shape in STAGED_ROWS + [(2, 2_400_128), (2, 1_146_888), (1, 2_400_056), (200, 8200)]:
        assert bt.scan_path(torch.empty(shape, device="meta"), -1) == "long_rows"
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        x[0, -3] = 6
        x[0, : 8192 + 5] = -INF
        if shape[1] > 50011:
            x[0, 20000:30000] += torch.arange(10000, dtype=torch.float64) / 128
            x[0, 40007] = 80
            x[0, 50011] = 50
        if shape[1] > 140_007:
            x[0, 100_003:140_007] = -INF
        if shape[0] > 1:
            x[1, shape[1] // 3 + 5] = INF
            x[-1, shape[1] // 2 + 77] = NAN
        x = x.to(dtype).cuda()
        for reverse in (False, True):
            poison_allocator(x.device, x.numel())
            check("logcumsumexp", x, -1, reverse)
            torch.testing.assert_close(bt.logcumsumexp(x, -1, reverse=reverse),
                                       bt.logcumsumexp(x, -1, reverse=reverse), atol=0, rtol=0,
                                       equal_nan=True)


# logcumsumexp forward on rows of several rounds of the swizzled grid (16M
# positions: about four rounds of two-byte tiles on an H100, eight of
# float32), where a tile's prefix is its block's previous tile's joined to
# the tiles between as one sum against a reference exponent
# (join_folds_on_reference, scan_publish.cuh), and the joins take over
# where that is not safe. Row 0: its first 700001 positions near -100, so
# that the tile where the row rises has a reference its earlier tiles
# weigh nothing against (their sum is no longer at least 1: the joins),
# though its first positions are all prefix; a drift of up to 15 above
# the row's values, weighed above the reference; a stretch of -inf over
# several tiles; and a jump to 200, which would overflow a weight. Rows 1
# and 2, whose first tiles a block takes after tiles of the row before, a
# +inf and a NaN. Tolerances tighter than tol's, which grows with the
# length: the results are a few rounding steps of the dtype from the
# float64 reference. Bit-identical run to run.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", float32_quick([torch.float16, torch.bfloat16, torch.float32]),
                         ids=str)
def test_staged_logcumsumexp_rounds_on_cuda(dtype):
    n = 1 << 24
    shape = (3, n)
    assert bt.scan_path(torch.empty(shape, device="meta"), -1) == "long_rows"
    g = torch.Generator().manual_seed(29)
    x = torch.randn(shape, generator=g)
    x[0, :700_001] -= 100
    drift = slice(3 * n // 10, 9 * n // 20)
    x[0, drift] += torch.linspace(0, 15, drift.stop - drift.start)
    x[0, n // 2 : n // 2 + 200_000] = -INF
    x[0, 7 * n // 10 : 7 * n // 10 + 1000] = 200
    x[1, 7 * n // 10 + 3] = INF
    x[2, 8 * n // 10 + 5] = NAN
    x = x.to(dtype).cuda()
    atol = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 2e-5}[dtype]
    for reverse in (False, True):
        poison_allocator(x.device, x.numel())
        got = bt.logcumsumexp(x, -1, reverse=reverse)
        ref = reference("logcumsumexp", x, -1, reverse).to(dtype)
        torch.testing.assert_close(got.double().cpu(), ref.double().cpu(), atol=atol,
                                   rtol=tol(dtype, 1)["rtol"], equal_nan=True)
        torch.testing.assert_close(bt.logcumsumexp(x, -1, reverse=reverse), got, atol=0, rtol=0,
                                   equal_nan=True)


# logcumsumexp backward on long rows: staged tiles of 4096 (dy, x and y
# staged, or on float32 dy and y, each thread's run of x read from memory;
# a thread's run of 16 carried by the recurrence S_s = dy_s +
# exp(y_s - y_{s-1}) S_{s-1}, scan_staged_logcumsumexp_grad.cuh) on compute
# capability 9.0 and up for float16, bfloat16 and float32; float64 takes the
# long_rows kernel. 81923 = 20 * 4096 + 3 ends in a tile of three elements,
# read and written element by element. Two-byte rows of whole 128-byte
# lines with at least a tile for every SM take swizzled stages of dy and y
# instead (runs of 32, tiles of 8192, scan_staged_swizzled_grad.cuh): on an
# H100, [3, 524288], and [2, 2400128], whose last tiles are short. Against
# the float64 reference, and bit-identical run to run, with a steep
# stretch, a stretch of wide noise (neighbouring y far apart) and dy zero
# over the first 6000 positions of the scan either way (the tiles there
# carry nothing); then with an all -inf prefix past a tile of either size,
# one large element, a +inf and a NaN, against the long_rows kernel (x one
# element off alignment), since torch's own gradient is NaN at -inf.
STAGED_GRAD_ROWS = STAGED_ROWS + [(1, 81923), (2, 40960), (2, 2_400_128)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", float32_quick([torch.float16, torch.bfloat16, torch.float32,
                                                torch.float64]), ids=str)
def test_staged_logcumsumexp_backward_on_cuda(dtype):
    g = torch.Generator().manual_seed(23)
    name = "logcumsumexp"
    for shape in STAGED_GRAD_ROWS:
        assert bt.scan_path(torch.empty(shape, device="meta"), -1) == "long_rows"
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        x[0, 10000:20000] += torch.arange(10000, dtype=torch.float64) / 128
        x[0, 22000:30000] *= 40
        x = x.to(dtype).cuda()
        dy = torch.randn(shape, generator=g).to(dtype).cuda()
        dy[:, :6000] = 0
        dy[:, -6000:] = 0
        for reverse in (False, True):
            poison_allocator(x.device, 2 * x.numel())
            got = our_grad(name, x, -1, reverse, dy)
            assert torch.equal(our_grad(name, x, -1, reverse, dy), got)
            assert_long_row_grad_close(name, got, x, reverse, dy)
        x[0, : 8192 + 5] = -INF
        x[0, 30007] = 80
        x[-1, shape[1] // 3 + 5] = INF
        x[-1, shape[1] // 2 + 77] = NAN
        for reverse in (False, True):
            poison_allocator(x.device, 2 * x.numel())
            got = our_grad(name, x, -1, reverse, dy)
            torch.testing.assert_close(our_grad(name, x, -1, reverse, dy), got, atol=0, rtol=0,
                                       equal_nan=True)
            unstaged = our_grad(name, off_boundary(x), -1, reverse, dy)
            torch.testing.assert_close(got, unstaged, **tol(dtype, shape[1]), equal_nan=True)


# cummax / cummin on the same long rows: the forward staged on compute
# capability 9.0 and up for float32 and two-byte elements (tiles of 4096,
# a thread scanning 16, scan_staged_extremes.cuh), the long_rows kernel for
# float64 and for rows that start off a 16-byte boundary, which must give
# the very same values and indices. Values on a coarse grid, so that ties
# abound (a later tie wins, as in torch), infinities in the first row, NaNs
# in the last on both sides of positions 2048 apart, where tiles of 2048
# (the long_rows kernel on float64) and of 4096 meet (a NaN takes over from
# there on, the last NaN winning); the outputs are written over a poisoned
# allocator; the gradients follow the indices.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", float32_quick([torch.float16, torch.bfloat16, torch.float32,
                                                torch.float64]), ids=str)
@pytest.mark.parametrize("name", EXTREME)
def test_long_rows_cummax_cummin_tile_edges_on_cuda(dtype, name):
    g = torch.Generator().manual_seed(12)
    for shape in STAGED_ROWS:
        assert bt.scan_path(torch.empty(shape, device="meta"), -1) == "long_rows"
        x = torch.randint(-60, 60, shape, generator=g).double() / 4
        x[0, torch.randint(0, shape[1], (20,), generator=g)] = INF
        x[0, torch.randint(0, shape[1], (20,), generator=g)] = -INF
        mid = shape[1] // 2 // 8192 * 8192
        x[-1, [mid - 1, mid, mid + 2047, mid + 2048, mid + 4095, mid + 4096]] = NAN
        x = x.to(dtype).cuda()
        dy = torch.randn(shape, generator=g).to(dtype).cuda()
        for reverse in (False, True):
            poison_allocator(x.device, 2 * x.numel())
            check(name, x, -1, reverse)
            values, indices = ours(name, x, -1, reverse)
            again = ours(name, x, -1, reverse)
            assert torch.equal(again[1], indices)
            torch.testing.assert_close(again[0], values, rtol=0, atol=0, equal_nan=True)
            unaligned = ours(name, off_boundary(x), -1, reverse)
            assert torch.equal(unaligned[1], indices)
            torch.testing.assert_close(unaligned[0], values, rtol=0, atol=0, equal_nan=True)
            got = our_grad(name, x, -1, reverse, dy).double().cpu()
            ref = reference_grad(name, x, -1, reverse, dy)
            torch.testing.assert_close(got, ref, **tol(dtype, shape[1]))


def keyed_rows_patterns(n):
    """Four rows of n for cummax: records (each above all before it, the
    values falling in between) on and next to the keyed long rows' tile
    edges (4096), the same flipped, one falling run (every index 0 forward),
    one rising run (every index n - 1 in reverse)."""
    i = torch.arange(n, dtype=torch.float64)
    edges = (4096 * 4096 - 1, 4096 * 4096, 4096 * 4097 - 1)  # where the fix-up's passes meet
    marks = [p for p in (0, 4095, 4096, 4097, 8191, 3 * 4096 - 1, n // 2, n - 4096, n - 1) + edges
             if 0 <= p < n]
    level = torch.zeros(n, dtype=torch.float64)
    for p in marks:
        level[p:] += 1
    stairs = level * 4 * n - i
    return torch.stack([stairs, stairs.flip(0), -i, i])


# cummax / cummin backward on aligned long rows scan each tile alone and
# then fix, in a second kernel, the one element per tile whose run comes in
# from the tiles before (scan_keyed_rows.cuh). Runs that end on and next to
# tile edges, or span every tile of a row, in both directions, on rows of
# whole tiles, of a ragged last tile, several rows at once and one row of
# an odd length; integer gradients, so float32 and float64 sums are exact
# and must equal the reference bit for bit (a carry missed or joined twice
# shows however small); reruns bit-identical; the gradient's every element
# written over a poisoned allocator.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", float32_quick([torch.bfloat16, torch.float32, torch.float64]),
                         ids=str)
@pytest.mark.parametrize("name", EXTREME)
def test_keyed_long_rows_carries_on_cuda(dtype, name):
    g = torch.Generator().manual_seed(31)
    sign = 1 if name == "cummax" else -1
    for n in (300000, 4 * 4096 + 8, 3 * 4096, 70001):
        rows = sign * keyed_rows_patterns(n)
        for x in [rows] + [rows[k:k + 1] for k in range(4)]:
            assert bt.scan_path(torch.empty(x.shape, device="meta"), -1) == "long_rows"
            x = x.to(dtype).cuda()
            dy = torch.randint(-4, 5, x.shape, generator=g).to(dtype).cuda()
            for reverse in (False, True):
                check(name, x, -1, reverse)
                poison_allocator(x.device, 2 * x.numel())
                got = our_grad(name, x, -1, reverse, dy)
                assert torch.equal(our_grad(name, x, -1, reverse, dy), got)
                ref = reference_grad(name, x, -1, reverse, dy)
                if dtype == torch.bfloat16:
                    torch.testing.assert_close(got.double().cpu(), ref, **tol(dtype, n))
                else:
                    assert torch.equal(got.double().cpu(), ref)


# The fix-up scans a row's tile records 4096 at a time: rows of more than
# 4096 tiles (16M elements) carry from one such pass to the next. Runs end
# on and next to where two passes meet; integer gradients, exact.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", EXTREME)
def test_keyed_long_rows_fixup_passes_on_cuda(name):
    n = 4096 * 4101 + 5
    sign = 1 if name == "cummax" else -1
    x = (sign * keyed_rows_patterns(n)[:2]).cuda()  # float64: every value exact
    assert bt.scan_path(torch.empty(x.shape, device="meta"), -1) == "long_rows"
    dy = torch.randint(-4, 5, x.shape, generator=torch.Generator().manual_seed(37)).double().cuda()
    for reverse in (False, True):
        poison_allocator(x.device, 2 * x.numel())
        got = our_grad(name, x, -1, reverse, dy)
        assert torch.equal(got.double().cpu(), reference_grad(name, x, -1, reverse, dy))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("reverse", [False, True])
def test_staged_long_rows_in_cuda_graph(reverse):
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2, 1 << 20, generator=g, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        bt.cumsum(x, 1, reverse=reverse)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = bt.cumsum(x, 1, reverse=reverse)
    for _ in range(2):
        x.copy_(torch.randn(2, 1 << 20, generator=g, device="cuda"))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, bt.cumsum(x, 1, reverse=reverse))
        check("cumsum", x, 1, reverse)


def assert_two_streams_match_alone(calls):
    """Queues `calls` (name, x, dim, reverse) with no sync between them on
    two new streams at once, the second in the opposite order, and asserts
    each result bit-identical to the same call made alone."""
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    got = [[None] * len(calls) for _ in streams]
    for i in range(len(calls)):
        for s, order, out in zip(streams, (calls, calls[::-1]), got):
            name, x, dim, reverse = order[i]
            with torch.cuda.stream(s):
                out[i if order is calls else len(calls) - 1 - i] = ours(name, x, dim, reverse)
    torch.cuda.synchronize()
    for k, (name, x, dim, reverse) in enumerate(calls):
        alone = ours(name, x, dim, reverse)
        torch.cuda.synchronize()
        for out in got:
            for a, b in zip(outputs(out[k]), outputs(alone)):
                assert torch.equal(a, b), (name, tuple(x.shape), x.dtype, reverse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_staged_rows_standing_slots_back_to_back_on_cuda():
    """Outside graph capture, the staged long rows keep their ready flags in
    slots each stream holds from call to call, zeroed only when allocated or
    grown, each call publishing under a mark of its own. Calls queued with
    no sync between them, on two new streams at once (the second in the
    opposite order), across ops, dtypes, directions and sizes whose slots
    outgrow the stream's first buffer, must each be bit-identical to the same
    call made alone: a flag left by an earlier call read as this call's would
    give a wrong prefix."""
    g = torch.Generator(device="cuda").manual_seed(23)
    calls = []
    # [1, 8M] float64 needs 4096 tiles of 2048 and their 128 groups: more
    # than a stream's first 64 KiB of slots.
    for shape in [(1, 1 << 18), (3, 1 << 20), (1, 1 << 23)]:
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            for k, name in enumerate(("cumsum", "cumprod", "logcumsumexp")):
                x = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
                if name == "cumprod":
                    x = 1 + x / 1024
                calls.append((name, x, -1, k % 2 == 1))
    assert all(bt.scan_path(x, -1) == "long_rows" for _, x, _, _ in calls)
    assert_two_streams_match_alone(calls)
    for name, x, dim, reverse in calls[-3:]:
        check(name, x, dim, reverse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_long_rows_share_standing_slots_with_staged_rows_on_cuda():
    """Outside graph capture, long_rows keeps its ticket counter and flagged
    states in the same standing slots as the staged long rows (a stream's
    buffer of flagged words), the counter set back to zero by each call's
    last ticket. Rows an odd number of elements long take long_rows, even
    ones the staged kernel; calls of both, queued with no sync between them
    on two new streams at once (the second in the opposite order), with
    slots that outgrow a stream's first buffer, must each be bit-identical
    to the same call made alone."""
    g = torch.Generator(device="cuda").manual_seed(31)
    calls = []
    # [1, 8M + 1] float32 has 4097 tiles of 2048 and their 129 groups: more
    # than a stream's first 64 KiB of slots. Float64 cummax / cummin forward
    # read their marks compared whole, the other ops by the zeroed-slots test.
    for n in [(1 << 20) + 1, 1 << 20, (1 << 23) + 1, 1 << 18]:
        for dtype in (torch.bfloat16, torch.float32, torch.float64):
            names = ("cummax", "cummin") if dtype == torch.float64 else ("logcumsumexp", "cummax",
                                                                         "cumsum")
            for k, name in enumerate(names):
                x = torch.randn((2, n) if n < 1 << 22 else (1, n), generator=g, device="cuda",
                                dtype=dtype)
                calls.append((name, x, -1, k % 2 == 1))
    assert all(bt.scan_path(x, -1) == "long_rows" for _, x, _, _ in calls)
    assert_two_streams_match_alone(calls)
    for name, x, dim, reverse in calls[::5]:
        check(name, x, dim, reverse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tile_paths_standing_slots_back_to_back_on_cuda():
    """Outside graph capture, column_tiles and strip_tiles keep their ticket
    counter and ready flags in slots each stream holds from call to call:
    the flags zeroed only when allocated, each call publishing under a mark
    of its own, the counter set back to zero by each call's last ticket, the
    states in a part of their own. Calls of both paths queued with no sync
    between them, on two new streams at once (the second in the opposite
    order), across ops, dtypes, directions and shapes whose states outgrow
    a stream's first buffer, must each be bit-identical to the same call
    made alone: a flag or ticket left by an earlier call read as this
    call's would give a wrong prefix or a hang."""
    g = torch.Generator(device="cuda").manual_seed(29)
    # strip_tiles (1100, 1024) along dim 0 has over 512 KiB of states, more
    # than a stream's first buffer holds. Were flags and states one region,
    # the calls after a larger one would read flags where it left states.
    shapes = [((40, 3, 512), 0), ((1100, 7), 0), ((1100, 1024), 0), ((32, 530, 33), 1),
              ((300, 1100), 0), ((4200, 64), 0), ((3, 500, 64), 1)]
    calls = []
    for shape, dim in shapes:
        for dtype in (torch.bfloat16, torch.float32, torch.float64):
            for k, name in enumerate(("cumsum", "logcumsumexp", "cummax")):
                x = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
                calls.append((name, x, dim, k % 2 == 1))
    assert {bt.scan_path(x, dim) for _, x, dim, _ in calls} == {"column_tiles", "strip_tiles"}
    assert_two_streams_match_alone(calls)
    for name, x, dim, reverse in calls[::7]:
        check(name, x, dim, reverse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_standing_slots_marks_wrap_on_cuda():
    """When a stream's standing slots run out of marks (after 2^32 - 1 calls
    for the tile paths' 32-bit flags), their marked part is zeroed and marks
    restart at 1. The test hook brings the wrap near. Calls of every path on
    standing slots cross it on one stream, each shape first taking marks 1
    and 2 before the wrap and then again after it, on other data: were the
    old flags left in place, a call after the wrap would read them as its
    own and take a stale prefix. Every call must be bit-identical to the
    same call made alone."""
    g = torch.Generator(device="cuda").manual_seed(37)
    shapes = [("cumsum", (2, 1 << 20), 1, "long_rows"),  # staged
              ("logcumsumexp", (2, (1 << 20) + 1), 1, "long_rows"),
              ("cumsum", (1100, 7), 0, "column_tiles"),
              ("cummax", (1100, 1024), 0, "strip_tiles")]
    assert all(bt.scan_path(torch.empty(shape, device="meta"), dim) == path
               for _, shape, dim, path in shapes)

    def calls():
        return [(name, torch.randn(shape, generator=g, device="cuda"), dim)
                for name, shape, dim, _ in shapes]

    # Each kind of slots serves two of the shapes, so a round of the calls
    # takes two marks of each kind, and the shapes take their marks in the
    # same order every round.
    rounds = [calls() for _ in range(4)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    got = []
    with torch.cuda.stream(stream):
        for k, round_calls in enumerate(rounds):
            if k == 1:  # marks 1 and 2 taken; then the last two, then 1 and 2 again
                like = round_calls[0][1]
                assert torch.ops.baracuda._scan_standing_marks_left(like, 2) == 2
            got.append([ours(name, x, dim) for name, x, dim in round_calls])
    torch.cuda.synchronize()
    for round_calls, round_got in zip(rounds, got):
        for (name, x, dim), out in zip(round_calls, round_got):
            alone = ours(name, x, dim)
            torch.cuda.synchronize()
            for a, b in zip(outputs(out), outputs(alone)):
                assert torch.equal(a, b), (name, tuple(x.shape))
    for name, x, dim in rounds[-1]:
        check(name, x, dim, False)
    with pytest.raises(RuntimeError, match=r"_scan_standing_marks_left: marks_left=-1"):
        torch.ops.baracuda._scan_standing_marks_left(rounds[0][0][1], -1)


# The paths that hand states from block to block behind ready marks in
# slots: outside graph capture the stream's standing slots, with no
# zeroing, the kernel launched programmatically behind whatever came
# before (on compute capability 9.0 and up); during capture a workspace
# zeroed by a kernel launched ahead, both launches programmatic, each
# allowed to start before the one ahead ends. long_rows here for
# logcumsumexp, cummax and float64 cummin, whose marks are compared whole
# (rows of aligned starts take the staged kernel for cumsum, logcumsumexp
# and float32 cummax: these rows are an odd number of elements long),
# column_tiles and strip_tiles for cumsum along dim 0.
WORKSPACE_CASES = [("logcumsumexp", (2, (1 << 20) + 1), 1, "long_rows", torch.float32),
                   ("cummax", (2, (1 << 20) + 1), 1, "long_rows", torch.float32),
                   ("cummin", (2, (1 << 20) + 1), 1, "long_rows", torch.float64),
                   ("cumsum", (1100, 7), 0, "column_tiles", torch.float32),
                   ("cumsum", (1100, 1024), 0, "strip_tiles", torch.float32)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name,shape,dim,path,dtype", WORKSPACE_CASES, ids=str)
def test_zeroed_workspace_paths_back_to_back_on_cuda(name, shape, dim, path, dtype):
    """Calls queued back to back on one stream, with no sync between them:
    the caching allocator hands each call's workspace out again to the next,
    so a zeroing that ran before the previous kernel finished would corrupt
    that one's tickets and flags (a wrong result or a hang)."""
    assert bt.scan_path(torch.empty(shape, device="meta"), dim) == path
    g = torch.Generator(device="cuda").manual_seed(13)
    xs = [torch.randn(shape, generator=g, device="cuda", dtype=dtype) for _ in range(12)]
    outs = [ours(name, x, dim, reverse=k % 2 == 1) for k, x in enumerate(xs)]
    torch.cuda.synchronize()
    for k, (x, out) in enumerate(zip(xs, outs)):
        alone = ours(name, x, dim, reverse=k % 2 == 1)
        torch.cuda.synchronize()
        for a, b in zip(outputs(out), outputs(alone)):
            assert torch.equal(a, b)  # bit-identical to a call with the GPU to itself
    check(name, xs[0], dim, False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name,shape,dim,path,dtype", WORKSPACE_CASES, ids=str)
def test_zeroed_workspace_paths_in_cuda_graph(name, shape, dim, path, dtype):
    g = torch.Generator(device="cuda").manual_seed(17)
    x = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ours(name, x, dim)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = outputs(ours(name, x, dim))
    for _ in range(2):
        x.copy_(torch.randn(shape, generator=g, device="cuda"))
        for out in captured:
            out.fill_(-1 if out.dtype == torch.int64 else float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(captured, outputs(ours(name, x, dim))):
            assert torch.equal(a, b)
        check(name, x, dim, False)


# Misaligned two-byte logcumsumexp long rows, a whole number of 4096-element
# segments long (they once took a segmented kernel of their own; they now
# run on long_rows, as the staged kernel needs 16-byte aligned rows). One
# row of 2048 segments, and three rows of 1024 (one row's carry must not
# leak into the next). In the first row an all -inf prefix spans two
# segments and a bit, and a steep stretch makes later segments outgrow the
# carry; with three rows, a NaN in the last one turns everything after it
# NaN (before it, reversed). The rows start 2 bytes past a 16-byte boundary:
# aligned ones take the staged kernel on compute capability 9.0 and up
# (test_staged_logcumsumexp_long_rows_on_cuda).
SEGMENT = 4096


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", BFLOAT16_QUICK, ids=str)
@pytest.mark.parametrize("shape", [(1, 2048 * SEGMENT), (3, 1024 * SEGMENT)], ids=str)
def test_logcumsumexp_segmented_long_rows_on_cuda(dtype, shape):
    assert bt.scan_path(torch.empty(shape, device="meta"), -1) == "long_rows"
    g = torch.Generator(device="cuda").manual_seed(5)
    n = shape[1]
    x = torch.randn(shape, generator=g, device="cuda", dtype=torch.float64)
    x[0, 5 * SEGMENT: 8 * SEGMENT] += torch.arange(3 * SEGMENT, device="cuda") / 64
    plain = x.to(dtype, copy=True)
    x[0, : 2 * SEGMENT + 5] = -INF
    if shape[0] > 1:
        x[-1, n // 2 + 77] = NAN
    x = misaligned(x.to(dtype))
    assert x.data_ptr() % 16 != 0 and x.is_contiguous()
    dy = torch.randn(shape, generator=g, device="cuda").to(dtype)
    for reverse in (False, True):
        check("logcumsumexp", x, 1, reverse)
        torch.testing.assert_close(bt.logcumsumexp(x, 1, reverse=reverse),
                                   bt.logcumsumexp(x, 1, reverse=reverse), atol=0, rtol=0,
                                   equal_nan=True)
        # -inf inputs get gradient 0 (torch's own is NaN there).
        got = our_grad("logcumsumexp", x[:1], 1, reverse, dy[:1])
        assert torch.isfinite(got).all() and (got[torch.isneginf(x[:1])] == 0).all()
        got = our_grad("logcumsumexp", plain, 1, reverse, dy)
        ref = reference_grad("logcumsumexp", plain, 1, reverse, dy)
        slack = logcumsumexp_grad_slack(plain, n)
        t = tol(dtype, n)
        torch.testing.assert_close(got.double().cpu(), ref.cpu(), atol=t["atol"] + slack,
                                   rtol=t["rtol"] + slack)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_long_rows_more_tile_groups_than_readers_on_cuda():
    """A row long enough that each reader of earlier groups' totals folds
    several of them (more groups than the 224 reading lanes of a long_rows
    block, for float32 tiles of three chunks). Small integers keep every
    float32 partial sum exact, so the check is equality. The row starts 4
    bytes past a 16-byte boundary, so that the long_rows kernel itself runs
    it on every GPU (aligned float32 cumsum rows take the staged kernel on
    compute capability 9.0 and up); the aligned row is checked too."""
    n = 240 * 32 * 3 * 2048 + 777
    g = torch.Generator(device="cuda").manual_seed(11)
    ints = torch.randint(-1, 2, (1, n), generator=g, device="cuda")
    for x in (misaligned(ints.float()), ints.float()):
        assert bt.scan_path(x, 1) == "long_rows"
        for reverse in (False, True):
            ref = ints.flip(1).cumsum(1).flip(1) if reverse else ints.cumsum(1)
            assert ref.abs().max().item() < 1 << 24
            got = bt.cumsum(x, 1, reverse=reverse)
            assert torch.equal(got.long(), ref)


# ---------------------------------------------------------------- integer and bool scans, dtype=
#
# References are torch's own integer ops on the CPU, in the same dtypes:
# integer scans are exact, so results must match bit for bit (overflow
# wraps the same way), cummax / cummin indices (ties: the later element)
# included. Shapes reach the integer kernel's edges on CUDA: rows of one
# block step (256 threads x 8 positions) and a position past it, inner sizes
# below, at and past one 32-column tile, more tiles than one launch's blocks.

ARITHMETIC = ["cumsum", "cumprod"]
# Every input dtype torch takes for each op (cumsum / cumprod give int64).
INT_INPUTS = {
    "cumsum": [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
               torch.uint16, torch.uint32, torch.uint64],
    "cummax": [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64],
}
INT_INPUTS["cumprod"] = INT_INPUTS["cumsum"]
INT_INPUTS["cummin"] = INT_INPUTS["cummax"]
# The dtypes torch scans cumsum / cumprod in when dtype= is given.
SCAN_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
               torch.float16, torch.bfloat16, torch.float32, torch.float64]
INT_CASES = [
    ((5, 37), 0), ((5, 37), -1), ((3, 40, 6), 1), ((4, 3, 2, 5), 2),
    ((2, 2049), -1), ((1, 4097), 1), ((3, 2048), -1),  # one block step, one past, two past
    ((200, 40), 0), ((65, 33), 0), ((64, 32), 0), ((129, 3, 31), 0),  # column tiles
    ((64, 1024), -1),  # two host tasks of lines
    ((70000, 2), -1),  # more tiles than blocks
]


def random_integers(shape, dtype, g, name="cumsum"):
    """Small values of `dtype` with many ties (and negatives where signed);
    cumprod gets odd factors too, so that products wrap rather than vanish."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    signed = dtype.is_signed
    low, high = (-7, 8) if name == "cumprod" else (-3, 4)
    x = torch.randint(low if signed else 0, high, shape, generator=g)
    if name in EXTREME and dtype in (torch.int64, torch.int32, torch.int16, torch.uint8):
        info = torch.iinfo(dtype)  # the type's extremes too
        pick = torch.rand(shape, generator=g)
        x = torch.where(pick < 0.05, torch.tensor(info.max), x)
        x = torch.where(pick > 0.95, torch.tensor(info.min), x)
    return x.to(dtype)


def flip(x, d):
    """x.flip(d), for the unsigned types torch's flip lacks too (by their bits)."""
    signed = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
    if x.dtype in signed:
        return x.view(signed[x.dtype]).flip(d).view(x.dtype)
    return x.flip(d)


def int_reference(name, x, dim, reverse=False, **kwargs):
    """torch's CPU op on x's own dtype, flipped around for reverse (indices
    back to the original coordinates)."""
    x = x.cpu()
    d = dim if x.dim() else 0
    reverse = reverse and x.dim() > 0  # one element either way
    src = flip(x, d) if reverse else x
    out = getattr(torch, name)(src, dim, **kwargs)
    if name in EXTREME:
        v, i = out
        if reverse:
            v, i = v.flip(d), (x.shape[d] - 1 - i).flip(d)
        return v, i
    return out.flip(d) if reverse else out


def assert_same(got, ref):
    """Equal dtypes, shapes and bits."""
    for a, b in zip(outputs(got), outputs(ref)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.cpu(), b), (a, b)


def check_int(name, x, dim, reverse, **kwargs):
    got = getattr(bt, name)(x, dim, reverse=reverse, **kwargs)
    assert_same(tuple(got) if name in EXTREME else got, int_reference(name, x, dim, reverse, **kwargs))


@pytest.mark.parametrize("name", ARITHMETIC + EXTREME)
def test_integer_and_bool_scans_match_torch(device, name, rng):
    for dtype in INT_INPUTS[name]:
        for shape, dim in INT_CASES:
            x = random_integers(shape, dtype, rng, name).to(device)
            assert bt.scan_path(x, dim) == "integer"
            for reverse in (False, True):
                check_int(name, x, dim, reverse)


@pytest.mark.parametrize("name", ARITHMETIC)
def test_dtype_argument_matches_torch(device, name, rng):
    """x is cast to dtype first, then scanned in it; integer dtypes wrap."""
    inputs = [random_integers((6, 300), torch.int32, rng, name),
              random_integers((6, 300), torch.bool, rng, name),
              random_integers((6, 300), torch.uint8, rng, name),
              torch.randn(6, 300, generator=rng) * 5,  # cast toward zero for integer dtypes
              torch.randn(6, 300, generator=rng, dtype=torch.float64)]
    if name == "cumprod":
        inputs[3:] = [1 + 0.01 * t for t in inputs[3:]]
    for given in inputs:
        for dtype in SCAN_DTYPES:
            x = given
            if dtype == torch.uint8 and x.is_floating_point():
                x = x.abs()  # a negative float's cast to uint8 is undefined
            if name == "cumprod" and dtype.is_floating_point and x.dtype in INT_INPUTS[name][1:]:
                x = x.clamp(-1, 1)  # integer products in floats would overflow
            for dim, reverse in ((1, False), (0, True), (-1, True)):
                got = getattr(bt, name)(x.to(device), dim, dtype=dtype, reverse=reverse)
                ref = int_reference(name, x, dim, reverse, dtype=dtype)
                if dtype.is_floating_point:
                    assert got.dtype == dtype
                    torch.testing.assert_close(got.double().cpu(), ref.double(),
                                               **tol(dtype, x.shape[dim]), equal_nan=True)
                else:
                    assert_same(got, ref)


def test_integer_overflow_wraps_like_torch(device):
    big = torch.tensor([2**62, 2**62, 2**62, -(2**63), 7, 2**63 - 1])
    for name in ARITHMETIC:
        for reverse in (False, True):
            check_int(name, big.to(device), 0, reverse)
            for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32):
                check_int(name, big.to(device), 0, reverse, dtype=dtype)
    # Products of odd factors wrap without vanishing.
    odd = torch.full((300,), 3, dtype=torch.int64)
    check_int("cumprod", odd.to(device), 0, False)
    assert bt.cumprod(odd.to(device), 0)[-1].item() != 0
    # uint64's bits are read as torch's cast reads them.
    u = torch.tensor([2**63 + 5, 1, 2**64 - 1], dtype=torch.uint64)
    check_int("cumsum", u.to(device), 0, False)


def test_integer_scans_empty_scalar_and_strided(device, rng):
    for name in ARITHMETIC + EXTREME:
        for dtype in (torch.int64, torch.int8, torch.bool):
            for shape, dim in (((0, 5), 0), ((0, 5), 1), ((3, 0), 1), ((2, 0, 4), -1)):
                x = torch.zeros(shape, dtype=dtype, device=device)
                check_int(name, x, dim, False)
            check_int(name, torch.tensor(3, dtype=dtype, device=device), 0, True)
            base = random_integers((7, 40, 9), dtype, rng, name).to(device)
            views = [base.transpose(0, 2), base[:, ::3, 1:], base[:, :1].expand(7, 5, 9),
                     base.permute(1, 2, 0)]
            for v in views:
                assert not v.is_contiguous()
                for dim in (0, 1, -1):
                    for reverse in (False, True):
                        check_int(name, v, dim, reverse)


def test_integer_scans_have_no_gradient():
    x = torch.randn(4, 5, requires_grad=True)
    for name in ARITHMETIC:
        op = getattr(bt, name)
        # torch refuses an integer dtype for an x that requires grad; so do we.
        with pytest.raises(RuntimeError, match=rf"baracuda::{name}: dtype=Long gives a result "
                                               "without gradient"):
            op(x, 1, dtype=torch.int64)
        with pytest.raises(RuntimeError):
            getattr(torch, name)(x, 1, dtype=torch.int64)
        with torch.no_grad():
            assert_same(op(x, 1, dtype=torch.int64), getattr(torch, name)(x, 1, dtype=torch.int64))
        assert not op(x.detach(), 1, dtype=torch.int32).requires_grad
        # A float dtype stays differentiable, the gradient in x's dtype.
        y = op(x, 1, dtype=torch.float64, reverse=True)
        assert y.dtype == torch.float64 and y.requires_grad
        (g,) = torch.autograd.grad(y.sum(), x)
        (g_ref,) = torch.autograd.grad(getattr(torch, name)(x.flip(1), 1, dtype=torch.float64)
                                       .flip(1).sum(), x)
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, g_ref)
    for name in EXTREME:
        values, indices = getattr(bt, name)(torch.arange(5), 0)
        assert not values.requires_grad and not indices.requires_grad


def test_integer_dtype_errors_name_op_and_dtype(device):
    ints = torch.ones(3, dtype=torch.int64, device=device)
    for dtype in (torch.int64, torch.int8, torch.bool):
        with pytest.raises(RuntimeError, match=r"baracuda::logcumsumexp: x.dtype=\w+ is not "
                                               "supported"):
            bt.logcumsumexp(ints.to(dtype), 0)
    for name in EXTREME:
        for dtype in (torch.uint16, torch.uint32, torch.uint64):
            with pytest.raises(RuntimeError, match=rf"baracuda::{name}: x.dtype=UInt\d+ is not "
                                                   "supported"):
                getattr(bt, name)(ints.to(dtype), 0)
    for name in ARITHMETIC:
        for dtype in (torch.bool, torch.uint16, torch.complex64):
            with pytest.raises(RuntimeError, match=rf"baracuda::{name}: dtype=\w+ is not "
                                                   "supported"):
                getattr(bt, name)(ints, 0, dtype=dtype)
        with pytest.raises(RuntimeError, match=rf"baracuda::{name}: x.dtype=ComplexFloat is not"):
            getattr(bt, name)(torch.ones(3, dtype=torch.complex64, device=device), 0)


def test_integer_paths():
    meta = lambda *s, dtype: torch.empty(s, device="meta", dtype=dtype)  # noqa: E731
    for dtype in (torch.int64, torch.int32, torch.uint8, torch.bool):
        assert bt.scan_path(meta(4096, 8192, dtype=dtype), -1) == "integer"
        assert bt.scan_path(meta(4096, 8192, dtype=dtype), 0) == "integer"
        assert bt.scan_path(meta(0, 5, dtype=dtype), 1) == "empty"


def test_opcheck_integer_and_dtype(device, rng):
    ops = torch.ops.baracuda
    ints = random_integers((3, 7, 2), torch.int32, rng).to(device)
    mask = random_integers((3, 7, 2), torch.bool, rng).to(device)
    x = torch.randn(3, 7, 2, generator=rng).to(device)
    for name in ARITHMETIC:
        op = getattr(ops, name).default
        opcheck(op, (ints, 1, False, None))
        opcheck(op, (mask, -1, True, None))
        opcheck(op, (ints, 0, False, torch.int8))
        opcheck(op, (mask, 1, False, torch.float32))
        opcheck(op, (x.clone().requires_grad_(), 1, True, torch.float64))
        opcheck(op, (x, 2, False, torch.int64))
    for name in EXTREME:
        for t in (ints, mask, ints.to(torch.uint8)):
            opcheck(getattr(ops, name).default, (t, 1, True))


def test_compile_position_ids_no_recompile(device, rng):
    """Position ids from an attention mask, as transformer code computes
    them: one graph for every sequence length."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def position_ids(mask, cumsum, cummax):
        pos = cumsum(mask, -1) - 1
        pos = pos.masked_fill(mask == 0, 1)
        return pos, cumsum(mask.bool(), -1, dtype=torch.int32), cummax(pos, -1)[0]

    def ours_(mask):
        return position_ids(mask, bt.cumsum, bt.cummax)

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(ours_, backend=counter, fullgraph=True, dynamic=True)
    for length in (7, 13):
        mask = (torch.rand(3, length, generator=rng) > 0.3).long().to(device)
        got = compiled(mask)
        ref = position_ids(mask.cpu(), torch.cumsum, torch.cummax)
        for a, b in zip(got, ref):
            assert_same(a, b)
    assert counter.frame_count == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ARITHMETIC + EXTREME)
def test_integer_scans_large_on_cuda(name):
    """Sizes the CPU suite keeps small: rows of many block steps, many column
    tiles, more tiles than blocks; bit for bit against torch."""
    g = torch.Generator().manual_seed(5)
    for shape, dim in (((2, 1 << 20), -1), ((3, 300001), 1), ((100000, 40), 0),
                       ((50, 3000, 7), 1), ((200000, 3), -1)):
        for dtype in (torch.int64, torch.int8, torch.bool):
            x = random_integers(shape, dtype, g, name).cuda()
            for reverse in (False, True):
                check_int(name, x, dim, reverse)
