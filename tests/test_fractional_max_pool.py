"""Fractional max pooling 2-D / 3-D: bit-exact against torch (values and
indices) with the same samples, the `even` placement against a float64
reference, deterministic backward, autograd, compile and errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.optests import opcheck

import baracuda_torch as bt
from helpers import poison_allocator

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
POOL = {2: (bt.fractional_max_pool2d, F.fractional_max_pool2d),
        3: (bt.fractional_max_pool3d, F.fractional_max_pool3d)}


def inputs(shape, dims, dtype, device, gen, batched=True):
    x = torch.randn(shape, generator=gen).to(dtype).to(device)
    n = shape[0] if batched else 1
    c = shape[1] if batched else shape[0]
    s = torch.rand(n, c, dims, generator=gen).to(dtype).to(device)
    return x, s


def assert_same_as_torch(x, dims, kernel, out_size, s):
    ours, theirs = POOL[dims]
    poison_allocator(x.device, x.numel())
    o, i = ours(x, kernel, out_size, return_indices=True, _random_samples=s)
    ro, ri = theirs(x, kernel, out_size, return_indices=True, _random_samples=s)
    assert torch.equal(i, ri), (i, ri)
    assert torch.equal(o.view(-1).double().nan_to_num(7.0), ro.view(-1).double().nan_to_num(7.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_2d_matches_torch_bit_for_bit(device, dtype, k, rng):
    x, s = inputs((2, 3, 23, 31), 2, dtype, device, rng)
    for out_size in [(1, 1), (7, 9), (23 - k + 1, 31 - k + 1), (11, 1)]:
        assert_same_as_torch(x, 2, k, out_size, s)
    assert_same_as_torch(x, 2, (k, max(1, k - 1)), (5, 12), s)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_3d_matches_torch_bit_for_bit(device, dtype, k, rng):
    x, s = inputs((2, 3, 9, 11, 13), 3, dtype, device, rng)
    # torch's 3-D op stops one short of input - kernel + 1 (ours allows it).
    for out_size in [(1, 1, 1), (3, 4, 5), (9 - k, 11 - k, 13 - k)]:
        assert_same_as_torch(x, 3, k, out_size, s)


@pytest.mark.parametrize("dims", [2, 3])
def test_unbatched_and_output_ratio(device, dims, rng):
    shape = (4, 19, 17) if dims == 2 else (4, 7, 9, 8)
    x, s = inputs(shape, dims, torch.float32, device, rng, batched=False)
    assert_same_as_torch(x, dims, 2, (5,) * dims, s)
    ours, theirs = POOL[dims]
    got = ours(x, 2, output_ratio=0.5, return_indices=True, _random_samples=s)
    ref = theirs(x, 2, output_ratio=(0.5,) * dims, return_indices=True, _random_samples=s)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@pytest.mark.parametrize("dims", [2, 3])
def test_default_samples_follow_torch_generator(device, dims):
    ours, theirs = POOL[dims]
    shape = (2, 3, 15, 14) if dims == 2 else (2, 3, 8, 9, 7)
    x = torch.randn(shape, device=device)
    torch.manual_seed(42)
    got = ours(x, 2, output_ratio=(0.5,) * dims, return_indices=True)
    torch.manual_seed(42)
    ref = theirs(x, 2, output_ratio=(0.5,) * dims, return_indices=True)
    assert torch.equal(got[1], ref[1]) and torch.equal(got[0], ref[0])


@pytest.mark.parametrize("dims", [2, 3])
def test_channels_last_and_strided_inputs(device, dims, rng):
    shape = (2, 5, 16, 18) if dims == 2 else (2, 5, 8, 10, 9)
    x, s = inputs(shape, dims, torch.float32, device, rng)
    fmt = torch.channels_last if dims == 2 else torch.channels_last_3d
    assert_same_as_torch(x.contiguous(memory_format=fmt), dims, 3, (5,) * dims, s)
    wide = torch.randn(*shape[:-1], shape[-1] * 2, generator=rng).to(device)
    assert_same_as_torch(wide[..., ::2], dims, 2, (5,) * dims, s)
    assert_same_as_torch(x.transpose(0, 1).contiguous().transpose(0, 1), dims, 3, (4,) * dims,
                         s.float())


def test_nan_and_ties_follow_torch(device, rng):
    x = torch.randint(0, 3, (2, 3, 20, 20), generator=rng).float().to(device)  # many ties
    x[0, 0, 3, 4] = float("nan")
    x[1, 2, 5:7, 5:7] = float("nan")
    x[0, 1] = -float("inf")
    s = torch.rand(2, 3, 2, generator=rng).to(device)
    assert_same_as_torch(x, 2, 3, (8, 8), s)


def even_reference(x, dims, kernel, out_size, s):
    """float64 reference of the `even` placement; returns (out, indices)."""
    batched = x.dim() == dims + 2
    xb = x if batched else x.unsqueeze(0)
    n, c = xb.shape[:2]
    sizes = xb.shape[2:]
    order = [1, 0] if dims == 2 else [0, 1, 2]
    out = torch.empty(n, c, *out_size, dtype=torch.float64)
    idx = torch.empty(n, c, *out_size, dtype=torch.long)
    x64 = xb.double().cpu()
    for b in range(n):
        for ch in range(c):
            starts = []
            for a in range(dims):
                u = float(s[b, ch, order[a]])
                span = sizes[a] - kernel[a]
                if out_size[a] == 1:
                    st = [math.floor(u * span)]
                else:
                    st = [math.floor(o * span / (out_size[a] - 1) + u) for o in range(out_size[a])]
                starts.append([min(max(v, 0), span) for v in st])
            for cell in torch.cartesian_prod(*[torch.arange(o) for o in out_size]).view(-1, dims):
                lo = [starts[a][int(cell[a])] for a in range(dims)]
                win = x64[b, ch][tuple(slice(lo[a], lo[a] + kernel[a]) for a in range(dims))]
                flat = int(win.reshape(-1).argmax())
                pos = list(torch.unravel_index(torch.tensor(flat), win.shape))
                lin = 0
                for a in range(dims):
                    lin = lin * sizes[a] + lo[a] + int(pos[a])
                out[(b, ch) + tuple(int(v) for v in cell)] = win.reshape(-1)[flat]
                idx[(b, ch) + tuple(int(v) for v in cell)] = lin
    if not batched:
        out, idx = out[0], idx[0]
    return out, idx


@pytest.mark.parametrize("dims", [2, 3])
def test_even_placement_matches_float64_formula(device, dims, rng):
    shape = (2, 2, 13, 11) if dims == 2 else (1, 2, 7, 8, 6)
    x, s = inputs(shape, dims, torch.float64, device, rng)
    ours = POOL[dims][0]
    for kernel, out_size in [((2,) * dims, (5,) * dims), ((3,) * dims, (1,) * dims)]:
        o, i = ours(x, kernel, out_size, return_indices=True, _random_samples=s, placement="even")
        ro, ri = even_reference(x, dims, kernel, out_size, s.cpu())
        assert torch.equal(i.cpu(), ri) and torch.equal(o.cpu(), ro)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("placement", ["torch", "even"])
def test_gradcheck_and_gradgradcheck(device, dims, placement, rng):
    shape = (2, 2, 11, 10) if dims == 2 else (1, 2, 6, 7, 5)
    x, s = inputs(shape, dims, torch.float64, device, rng)
    x.requires_grad_()
    ours = POOL[dims][0]
    fn = lambda t: ours(t, 2, (4,) * dims, _random_samples=s, placement=placement)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dims", [2, 3])
def test_backward_matches_torch_and_is_deterministic(device, dtype, dims, rng):
    shape = (2, 3, 21, 19) if dims == 2 else (2, 3, 9, 10, 8)
    x, s = inputs(shape, dims, dtype, device, rng)
    ours, theirs = POOL[dims]
    out_size = (8,) * dims if dims == 2 else (4,) * dims
    xg = x.clone().requires_grad_()
    y = ours(xg, 3, out_size, _random_samples=s)
    dy = torch.randn(y.shape, generator=rng).to(dtype).to(device)
    (g1,) = torch.autograd.grad(y, xg, dy)
    with torch.backends.cudnn.flags(enabled=True):
        torch.use_deterministic_algorithms(True)
        try:
            (g2,) = torch.autograd.grad(ours(xg, 3, out_size, _random_samples=s), xg, dy)
        finally:
            torch.use_deterministic_algorithms(False)
    assert torch.equal(g1, g2)
    xr = x.clone().requires_grad_()
    (ref,) = torch.autograd.grad(theirs(xr, 3, out_size, _random_samples=s), xr, dy)
    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    torch.testing.assert_close(g1.double(), ref.double(), atol=tol, rtol=tol)


# Shapes chosen for the CUDA backward's paths: several bands per plane, windows
# overlapping up to k deep (many slots), a row too wide for shared memory (the
# plain gather), odd sizes; both placements.
BACKWARD_CASES = [
    (2, (2, 3, 150, 37), 3, (74, 18)),
    (2, (1, 2, 40, 41), 5, (36, 37)),
    (2, (1, 2, 61, 60), 4, (30, 29)),
    (2, (1, 1, 6, 3000), (2, 5), (5, 2996)),
    (3, (1, 2, 20, 64, 64), 2, (10, 32, 32)),
    (3, (1, 2, 9, 13, 11), 3, (7, 8, 9)),
    (3, (1, 1, 4, 100, 100), 3, (2, 49, 49)),
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=lambda c: "x".join(map(str, c[1])))
@pytest.mark.parametrize("placement", ["torch", "even"])
def test_backward_matches_scatter_reference(device, dtype, case, placement, rng):
    dims, shape, k, out_size = case
    x, s = inputs(shape, dims, dtype, device, rng)
    kernel = [k] * dims if isinstance(k, int) else list(k)
    out, idx = torch.ops.baracuda.fractional_max_pool.default(x, kernel, out_size, s, placement)
    # Gradient and indices with permuted strides: the kernel must follow them.
    dy = torch.randn(out.shape, generator=rng).to(dtype).to(device)
    dy_t = dy.transpose(-1, -2).contiguous().transpose(-1, -2)
    idx_t = idx.transpose(-1, -2).contiguous().transpose(-1, -2)
    poison_allocator(device, x.numel())
    g = torch.ops.baracuda.fractional_max_pool_backward.default(dy_t, idx_t, s, list(shape),
                                                                kernel, placement)
    planes = math.prod(shape[:-dims])
    ref = torch.zeros(planes, math.prod(shape[-dims:]), dtype=torch.float64)
    ref.scatter_add_(1, idx.cpu().reshape(planes, -1), dy.double().cpu().reshape(planes, -1))
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(dtype, 1e-6)
    torch.testing.assert_close(g.double().cpu(), ref.view(shape), atol=tol, rtol=tol)
    again = torch.ops.baracuda.fractional_max_pool_backward.default(dy, idx, s, list(shape),
                                                                    kernel, placement)
    assert torch.equal(g, again)


@pytest.mark.parametrize("dims", [2, 3])
def test_opcheck_forward_and_backward(device, dims, rng):
    shape = (2, 3, 9, 8) if dims == 2 else (1, 2, 5, 6, 7)
    x, s = inputs(shape, dims, torch.float64, device, rng)
    k, o = [2] * dims, [3] * dims
    opcheck(torch.ops.baracuda.fractional_max_pool.default, (x.requires_grad_(), k, o, s, "torch"))
    out, idx = torch.ops.baracuda.fractional_max_pool.default(x, k, o, s, "torch")
    gy = torch.randn(out.shape, generator=rng, dtype=torch.float64).to(device)
    opcheck(torch.ops.baracuda.fractional_max_pool_backward.default,
            (gy.requires_grad_(), idx, s, list(x.shape), k, "torch"))


@pytest.mark.slow
def test_compile_fullgraph_dynamic(device, rng):
    def f(x, s):
        return bt.fractional_max_pool2d(x, 3, output_ratio=0.5, _random_samples=s).sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for size in (20, 26):
        x, s = inputs((2, 3, size, size + 1), 2, torch.float32, device, rng)
        torch.testing.assert_close(compiled(x, s), f(x, s))


def test_modules_match_torch_modules(device, rng):
    x, s = inputs((2, 3, 15, 16), 2, torch.float32, device, rng)
    ours = bt.nn.FractionalMaxPool2d(3, output_size=(6, 7), return_indices=True, _random_samples=s)
    ref = torch.nn.FractionalMaxPool2d(3, output_size=(6, 7), return_indices=True,
                                       _random_samples=s)
    assert all(torch.equal(a, b) for a, b in zip(ours(x), ref(x)))
    x3, s3 = inputs((1, 2, 8, 9, 7), 3, torch.float32, device, rng)
    ours3 = bt.nn.FractionalMaxPool3d(2, output_ratio=0.5, _random_samples=s3)
    ref3 = torch.nn.FractionalMaxPool3d(2, output_ratio=0.5, _random_samples=s3)
    assert torch.equal(ours3(x3), ref3(x3))
    with pytest.raises(ValueError, match="output_ratio"):
        bt.nn.FractionalMaxPool2d(2, output_ratio=1.5)


def test_empty_planes(device):
    x = torch.randn(0, 3, 10, 10, device=device)
    s = torch.rand(0, 3, 2, device=device)
    o, i = bt.fractional_max_pool2d(x, 2, (4, 4), return_indices=True, _random_samples=s)
    assert o.shape == (0, 3, 4, 4) and i.shape == (0, 3, 4, 4)


def test_errors_are_clear(device, rng):
    x, s = inputs((2, 3, 10, 10), 2, torch.float32, device, rng)
    f = bt.fractional_max_pool2d
    with pytest.raises(RuntimeError, match=r"kernel_size=\[11, 11\] is larger than the input"):
        f(x, 11, (1, 1), _random_samples=s)
    with pytest.raises(RuntimeError, match=r"output_size=\[9, 9\] is too large .* at most input - "
                                           r"kernel \+ 1 = 8"):
        f(x, 3, (9, 9), _random_samples=s)
    with pytest.raises(ValueError, match="exactly one of output_size and output_ratio"):
        f(x, 2, (4, 4), output_ratio=0.5, _random_samples=s)
    with pytest.raises(ValueError, match="exactly one of output_size and output_ratio"):
        f(x, 2, _random_samples=s)
    with pytest.raises(ValueError, match=r"output_ratio=1.0 must lie in \(0, 1\)"):
        f(x, 2, output_ratio=1.0, _random_samples=s)
    with pytest.raises(RuntimeError, match=r"samples.shape=\[2, 3, 3\] must be \[2, 3, 2\]"):
        f(x, 2, (4, 4), _random_samples=torch.rand(2, 3, 3, device=device))
    with pytest.raises(RuntimeError, match=r"samples.dtype=Double must be Float"):
        f(x, 2, (4, 4), _random_samples=s.double())
    with pytest.raises(ValueError, match=r"x.dim\(\)=2 must be 3"):
        f(x[0, 0], 2, (4, 4))
    with pytest.raises(ValueError, match=r"x.dim\(\)=3 must be 4"):
        bt.fractional_max_pool3d(x[0], 2, (4, 4, 4))
    with pytest.raises(RuntimeError, match=r"placement='middle' must be"):
        f(x, 2, (4, 4), _random_samples=s, placement="middle")
    with pytest.raises(RuntimeError, match=r"x.dtype=Long is not supported"):
        f(x.long(), 2, (4, 4), _random_samples=s)


def test_tensors_on_another_device_raise(device, rng):
    # A meta tensor among them sends the call to the ops' Meta kernels, which
    # must refuse as the real kernels do.
    x, s = inputs((2, 3, 10, 10), 2, torch.float32, device, rng)
    meta = torch.device("meta")
    with pytest.raises(RuntimeError, match=rf"baracuda::fractional_max_pool: samples is on meta but "
                                           rf"the input is on {device}"):
        bt.fractional_max_pool2d(x, 2, (4, 4), _random_samples=s.to(meta))
    out, indices = bt.fractional_max_pool2d(x, 2, (4, 4), return_indices=True, _random_samples=s)
    backward = torch.ops.baracuda.fractional_max_pool_backward
    with pytest.raises(RuntimeError, match=rf"baracuda::fractional_max_pool_backward: indices is on "
                                           rf"meta but grad_out is on {device}"):
        backward(out, indices.to(meta), s, list(x.shape), [2, 2])


def test_unsupported_dtype_without_samples_is_named(device):
    # The samples are drawn in x's dtype: the dtype must be checked first,
    # not left to torch.rand's sampler.
    x = torch.zeros(2, 3, 10, 10, device=device)
    use = r"is not supported; use float16, bfloat16, float32 or float64"
    with pytest.raises(RuntimeError, match=r"fractional_max_pool2d: x.dtype=torch.int64 " + use):
        bt.fractional_max_pool2d(x.long(), 2, (4, 4))
    with pytest.raises(RuntimeError, match=r"fractional_max_pool2d: x.dtype=torch.bool " + use):
        bt.nn.FractionalMaxPool2d(2, output_size=(4, 4))(x.bool())
    with pytest.raises(RuntimeError, match=r"fractional_max_pool3d: x.dtype=torch.uint8 " + use):
        bt.fractional_max_pool3d(x.to(torch.uint8), 2, output_ratio=0.5)
    with pytest.raises(RuntimeError, match=r"fractional_max_pool3d: x.dtype=torch.int32 " + use):
        bt.nn.FractionalMaxPool3d(2, output_ratio=0.5)(x.int())
