"""linear_scan: h_t = a_t h_{t-1} + b_t along one axis, and its backward.

The reference is a float64 step-by-step loop on the same values (the inputs
upcast exactly); gradients are compared with autograd through that loop.
Shapes are chosen so that, on CUDA, every path of the scan engine runs (the
tests assert the path).
"""

import pytest
import torch
from torch.testing._internal.optests import opcheck

import baracuda_torch as bt
from helpers import bits, poison_allocator

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
NAN = float("nan")

# Shapes / dims that reach each CUDA path (scan_plan.h).
PATH_CASES = [
    ((37, 64), -1, "row_groups"),
    ((33, 1000), -1, "row_groups"),
    ((5, 2001), -1, "rows"),
    ((2, 70000), -1, "long_rows"),
    ((3, 40), 0, "columns"),
    ((32769, 2), 0, "columns"),
    ((1100, 7), 0, "column_tiles"),
    ((2, 33, 5, 3), 1, "column_tiles"),
    ((300, 1100), 0, "strip_tiles"),
    ((3, 500, 64), 1, "strip_tiles"),
    ((300, 8200), 0, "column_strips"),
    ((8, 50, 1001), 1, "column_strips"),
    ((2, 300, 2048), 1, "column_strips"),
]
# Fewer, smaller shapes for the backward (still one per path).
BACKWARD_CASES = [
    ((37, 64), -1, "row_groups"),
    ((5, 2001), -1, "rows"),
    ((2, 5000), -1, "long_rows"),  # one group of tiles (the forward cases have more)
    ((3, 40), 0, "columns"),
    ((1100, 7), 0, "column_tiles"),
    ((300, 1100), 0, "strip_tiles"),
    ((2, 300, 2048), 1, "column_strips"),
    ((8, 50, 1001), 1, "column_strips"),
]
# Tolerance relative to the result's largest magnitude.
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 2e-5, torch.float64: 1e-12}


def reference(a, b, dim, reverse=False, h0=None):
    """The recurrence step by step, in float64."""
    if a.dim() == 0:
        return reference(a.reshape(1), b.reshape(1), 0, reverse,
                         None if h0 is None else h0.reshape(())).reshape(())
    a64 = a.double().movedim(dim, 0)
    b64 = b.double().movedim(dim, 0)
    h = torch.empty_like(a64)
    state = torch.zeros_like(a64[0]) if h0 is None else h0.double().expand_as(a64[0])
    steps = range(a64.shape[0] - 1, -1, -1) if reverse else range(a64.shape[0])
    for t in steps:
        state = a64[t] * state + b64[t]
        h[t] = state
    return h.movedim(0, dim)


def inputs(shape, dtype, device, rng, a_low=-0.95, a_high=0.95):
    a = (torch.rand(shape, generator=rng, dtype=torch.float64) * (a_high - a_low) + a_low)
    b = torch.randn(shape, generator=rng, dtype=torch.float64)
    return a.to(dtype).to(device), b.to(dtype).to(device)


def assert_close_scaled(got, want, dtype):
    scale = max(want.abs().max().item(), 1.0) if want.numel() else 1.0
    tol = TOL[dtype] * scale
    torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=tol, equal_nan=True)


def check_path(device, x, dim, path):
    if device.type == "cuda":
        assert bt.scan_path(x, dim) == path


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim,path", PATH_CASES)
def test_matches_float64_loop(device, dtype, shape, dim, path, rng):
    a, b = inputs(shape, dtype, device, rng)
    check_path(device, a, dim, path)
    for reverse in (False, True):
        poison_allocator(device, a.numel())
        h = bt.linear_scan(a, b, dim, reverse=reverse)
        assert h.dtype == dtype and h.shape == a.shape and h.is_contiguous()
        assert_close_scaled(h, reference(a, b, dim, reverse), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_h0_full_and_broadcast(device, dtype, rng):
    a, b = inputs((4, 300, 24), dtype, device, rng)
    for reverse in (False, True):
        for h0_shape in ((4, 24), (24,), (1, 24), (4, 1), ()):
            h0 = torch.randn(h0_shape, generator=rng).to(device)
            h = bt.linear_scan(a, b, 1, reverse=reverse, h0=h0)
            # The half types round the first step to their dtype once, well
            # within their tolerance.
            want = reference(a, b, 1, reverse, h0)
            assert_close_scaled(h, want, dtype)


def test_h0_of_the_state_dtype(device, rng):
    # A float32 state for bfloat16 steps.
    a, b = inputs((3, 50, 8), torch.bfloat16, device, rng)
    h0 = torch.randn(3, 8, generator=rng).to(device)
    assert_close_scaled(bt.linear_scan(a, b, 1, h0=h0), reference(a, b, 1, False, h0),
                        torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zeros_in_a_are_exact(device, dtype, rng):
    a, b = inputs((6, 3000), dtype, device, rng)
    a[:, ::7] = 0
    a[:, 1000:1100] = 0
    h = bt.linear_scan(a, b, 1)
    # Where a_t is 0 the state restarts: h_t is b_t exactly.
    zero = a == 0
    assert torch.equal(h[zero], b[zero])
    assert_close_scaled(h, reference(a, b, 1), dtype)
    # And its gradient is exact there too: no division by a.
    a.requires_grad_()
    b.requires_grad_()
    g = torch.randn(a.shape, generator=rng, dtype=dtype).to(device)
    da, db = torch.autograd.grad(bt.linear_scan(a, b, 1), (a, b), g)
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    da64, db64 = torch.autograd.grad(reference(a64, b64, 1), (a64, b64), g.double())
    assert_close_scaled(da, da64, dtype)
    assert_close_scaled(db, db64, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_growing_a(device, dtype, rng):
    # |a| > 1: the state grows (1.05^400 ~ 3e8), and so do the products the
    # joins form.
    a, b = inputs((5, 400), dtype, device, rng, a_low=1.0, a_high=1.1)
    for reverse in (False, True):
        h = bt.linear_scan(a, b, 1, reverse=reverse)
        want = reference(a, b, 1, reverse)
        torch.testing.assert_close(h.double(), want, rtol=TOL[dtype] * 10, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_in_nan_out(device, dtype, rng):
    for shape, dim in (((3, 5000), 1), ((300, 1100), 0), ((2, 300, 2048), 1)):
        a, b = inputs(shape, dtype, device, rng)
        n = shape[dim]
        a.narrow(dim, n // 3, 1).fill_(NAN)
        b.narrow(dim, 0, 1).select(0, 0).fill_(NAN)
        h = bt.linear_scan(a, b, dim)
        want = reference(a, b, dim)
        assert torch.equal(h.isnan(), want.isnan())
        assert want.narrow(dim, n // 3, n - n // 3).isnan().all()


def test_float32_state_for_half_types(device, rng):
    # Many small steps: a state rounded to bfloat16 at every step would drift
    # by far more than one rounding of the result.
    n = 4096
    a = torch.full((2, n), 0.999, dtype=torch.bfloat16, device=device)
    b = torch.full((2, n), 1e-3, dtype=torch.bfloat16, device=device)
    h = bt.linear_scan(a, b, 1)
    want = reference(a, b, 1)
    torch.testing.assert_close(h.double(), want, rtol=1e-2, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim,path", BACKWARD_CASES)
def test_backward_matches_autograd_of_loop(device, dtype, shape, dim, path, rng):
    a, b = inputs(shape, dtype, device, rng)
    check_path(device, a, dim, path)
    g = torch.randn(shape, generator=rng, dtype=torch.float64).to(dtype).to(device)
    state = list(shape)
    del state[dim]
    for reverse, with_h0 in ((False, False), (True, True)):
        h0 = torch.randn(state, generator=rng).to(dtype).to(device) if with_h0 else None
        leaves = [a.clone().requires_grad_(), b.clone().requires_grad_()]
        if with_h0:
            leaves.append(h0.clone().requires_grad_())
        poison_allocator(device, a.numel())
        got = torch.autograd.grad(bt.linear_scan(leaves[0], leaves[1], dim, reverse=reverse,
                                                 h0=leaves[2] if with_h0 else None), leaves, g)
        ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
        want = torch.autograd.grad(reference(ref_leaves[0], ref_leaves[1], dim, reverse,
                                             ref_leaves[2] if with_h0 else None),
                                   ref_leaves, g.double())
        for x, y in zip(got, want):
            assert x.dtype == dtype
            assert_close_scaled(x, y, dtype)


@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck_and_gradgradcheck(device, reverse, rng):
    opts = dict(dtype=torch.float64, device=device)
    for shape, dim, h0_shape in (((4, 9), 1, (4,)), ((3, 5, 2), 1, (1, 2)), ((6, 3), 0, None),
                                 ((), 0, ())):
        a = (torch.rand(shape, generator=rng, dtype=torch.float64) * 1.6 - 0.8).to(device)
        b = torch.randn(shape, generator=rng, **dict(dtype=torch.float64)).to(device)
        a.requires_grad_()
        b.requires_grad_()
        args = [a, b]
        if h0_shape is not None:
            args.append(torch.randn(h0_shape, **opts).requires_grad_())

        def fn(a, b, h0=None):
            return bt.linear_scan(a, b, dim, reverse=reverse, h0=h0)

        assert torch.autograd.gradcheck(fn, args)
        assert torch.autograd.gradgradcheck(fn, args)


def test_deterministic(device, rng):
    prev = torch.are_deterministic_algorithms_enabled()
    try:
        for deterministic in (False, True):
            torch.use_deterministic_algorithms(deterministic)
            for shape, dim in (((2, 70000), 1), ((8, 50, 1001), 1), ((300, 1100), 0)):
                a, b = inputs(shape, torch.float32, device, rng)
                a.requires_grad_()
                dy = torch.randn(shape, generator=rng).to(device)
                runs = []
                for _ in range(3):
                    h = bt.linear_scan(a, b, dim)
                    (da,) = torch.autograd.grad(h, a, dy)
                    runs.append((bits(h), bits(da)))
                for h_bits, da_bits in runs[1:]:
                    assert torch.equal(h_bits, runs[0][0]) and torch.equal(da_bits, runs[0][1])
    finally:
        torch.use_deterministic_algorithms(prev)


def test_strided_inputs(device, rng):
    a, b = inputs((40, 300), torch.float32, device, rng)
    at, bt_ = a.t(), b[:, ::1].t()  # non-contiguous, scanned along dim 0 of [300, 40]
    h = bt.linear_scan(at, bt_, 0)
    assert h.is_contiguous()
    assert_close_scaled(h, reference(at, bt_, 0), torch.float32)
    wide = torch.randn(40, 600, generator=rng).to(device)[:, ::2]
    assert_close_scaled(bt.linear_scan(a, wide, 1), reference(a, wide, 1), torch.float32)


def test_empty_and_zero_dim(device):
    for shape, dim in (((3, 0, 4), 1), ((0, 5), 1), ((0, 5), 0)):
        a = torch.zeros(shape, device=device, requires_grad=True)
        b = torch.zeros(shape, device=device, requires_grad=True)
        state = list(shape)
        del state[dim]
        h0 = torch.zeros(state, device=device, requires_grad=True)
        h = bt.linear_scan(a, b, dim, h0=h0)
        assert h.shape == a.shape
        grads = torch.autograd.grad(h.sum(), (a, b, h0))
        assert [g.shape for g in grads] == [a.shape, b.shape, h0.shape]
        assert not grads[2].any()
    a = torch.tensor(0.5, device=device)
    b = torch.tensor(2.0, device=device)
    assert bt.linear_scan(a, b, 0, h0=torch.tensor(4.0, device=device)).item() == 4.0
    assert bt.linear_scan(a, b, -1).item() == 2.0


def test_opcheck(device, rng):
    ops = torch.ops.baracuda
    a = (torch.rand(3, 7, 2, generator=rng) * 1.6 - 0.8).to(device)
    b = torch.randn(3, 7, 2, generator=rng).to(device)
    h0 = torch.randn(3, 2, generator=rng).to(device)
    for dim, reverse, state in ((1, False, None), (-1, True, None), (1, False, h0),
                                (0, True, h0[0])):
        opcheck(ops.linear_scan.default,
                (a.clone().requires_grad_(), b.clone().requires_grad_(), dim, reverse,
                 None if state is None else state.clone().requires_grad_()))
    h = bt.linear_scan(a, b, 1, h0=h0)
    dy = torch.randn(3, 7, 2, generator=rng).to(device)
    opcheck(ops.linear_scan_backward.default, (dy, a, h, h0, 1, False))
    opcheck(ops.linear_scan_backward.default, (dy.double(), a.double(), h.double(), None, 1, True))


def test_compile_fullgraph_dynamic_no_recompile(device, rng):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def f(a, b, h0):
        h = bt.linear_scan(a, b, 1, h0=h0) + bt.linear_scan(a, b, 0, reverse=True)
        return (h * h).sum()

    compiled = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        a = (torch.rand(rows, 6, 3, generator=rng) * 1.6 - 0.8).to(device).requires_grad_()
        b = torch.randn(rows, 6, 3, generator=rng).to(device).requires_grad_()
        h0 = torch.randn(rows, 3, generator=rng).to(device).requires_grad_()
        out = compiled(a, b, h0)
        torch.testing.assert_close(out, f(a, b, h0))
        got = torch.autograd.grad(out, (a, b, h0))
        want = torch.autograd.grad(f(a, b, h0), (a, b, h0))
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y)
    assert counter.frame_count == 1


def test_errors_name_op_and_value(device):
    ones = torch.ones(2, 3, device=device)
    with pytest.raises(RuntimeError, match=r"baracuda::linear_scan: b.shape=\[2, 4\] must equal "
                                           r"a.shape=\[2, 3\]"):
        bt.linear_scan(ones, torch.ones(2, 4, device=device), 1)
    with pytest.raises(RuntimeError, match=r"baracuda::linear_scan: b.dtype=Double must equal "
                                           r"a.dtype=Float"):
        bt.linear_scan(ones, ones.double(), 1)
    with pytest.raises(RuntimeError, match=r"baracuda::linear_scan: a.dtype=Long is not supported"):
        bt.linear_scan(ones.long(), ones.long(), 1)
    with pytest.raises(RuntimeError, match=r"baracuda::linear_scan: dim=2 out of range"):
        bt.linear_scan(ones, ones, 2)
    with pytest.raises(RuntimeError, match=r"baracuda::linear_scan: h0.shape=\[3, 3\] must "
                                           r"broadcast to the state's shape \[2\]"):
        bt.linear_scan(ones, ones, 1, h0=torch.ones(3, 3, device=device))
    with pytest.raises(RuntimeError, match=r"baracuda::linear_scan: h0.dtype=Long is not "
                                           r"supported"):
        bt.linear_scan(ones, ones, 1, h0=torch.ones(2, dtype=torch.long, device=device))
    with pytest.raises(RuntimeError, match=r"baracuda::linear_scan_backward: h.shape=\[2\] must "
                                           r"equal grad.shape=\[2, 3\]"):
        torch.ops.baracuda.linear_scan_backward(ones, ones, ones[:, 0], None, 1, False)
    with pytest.raises(RuntimeError, match=r"kind='linear_scan' has its own backward op"):
        torch.ops.baracuda.scan_backward(ones, ones, ones, None, 1, "linear_scan", False)


def test_scan_path_names_linear_scan_kernels(device):
    x = torch.ones(8, 256, 2048, device=device)
    if device.type == "cpu":
        assert bt.scan_path(x, 1, "linear_scan") == "host"
        return
    forward = bt.scan_path(x, 1, "linear_scan")
    backward = bt.scan_path(x, 1, "linear_scan", backward=True)
    assert forward in {"column_strips", "staged_strips"}
    assert backward in {"column_strips", "staged_strips"}
    with pytest.raises(RuntimeError, match="a.dtype|x.dtype"):
        bt.scan_path(x.long(), 1, "linear_scan")
