"""Block-sparse attention backward: gradients of q, k and v through out and lse.

References are float64 autograd through plain torch ops with the same dense
element mask, from the very inputs the op sees (half inputs rounded first).
Rows with no visible key must get exactly zero gradients. On CUDA, half
inputs with D in {64, 128} and blocks that are multiples of 64 run the
tensor-core forward; every backward case is checked whatever executor runs.
"""

import math

import pytest
import torch
from torch.testing._internal.optests import opcheck

import baracuda_torch as bt
from baracuda_torch import masks
from test_block_sparse_attention import inputs, random_mask

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def rel_tol(dtype):
    """Bound on ||grad - ref|| / ||ref||: half types round out (and so delta)
    and the gradients themselves."""
    return {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 2e-5,
            torch.float64: 1e-10}[dtype]


def dense_mask(m, q, k, block_size, is_causal):
    dense = masks.to_dense(m.cpu(), q.shape[2], k.shape[2], block_size, is_causal=is_causal)
    return dense.expand(q.shape[0], q.shape[1], -1, -1)


def reference_attention(q, k, v, dense, scale=None):
    """(out, lse) by plain torch ops, differentiable; empty rows are (0, -inf)
    with zero gradients."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~dense, -math.inf)
    empty = ~dense.any(-1)
    s = s.masked_fill(empty[..., None], 0.0)  # a finite lse for rows that see nothing
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]) * dense
    return p @ v, lse.masked_fill(empty, -math.inf)


def reference_grads(q, k, v, dense, grad_out, grad_lse, scale=None):
    q, k, v = (t.detach().double().cpu().requires_grad_() for t in (q, k, v))
    out, lse = reference_attention(q, k, v, dense, scale)
    loss = (out * grad_out.double().cpu()).sum()
    if grad_lse is not None:
        finite = torch.isfinite(lse)
        loss = loss + torch.where(finite, lse, 0.0).mul(grad_lse.double().cpu()).sum()
    return torch.autograd.grad(loss, (q, k, v))


def grads(q, k, v, m, block_size, grad_out, grad_lse=None, is_causal=False, scale=None):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = bt.block_sparse_attention(q, k, v, m, block_size=block_size, is_causal=is_causal,
                                         scale=scale, return_lse=True)
    outputs, cotangents = [out], [grad_out]
    if grad_lse is not None:
        outputs.append(lse)
        cotangents.append(grad_lse)
    return torch.autograd.grad(outputs, (q, k, v), cotangents)


def assert_grads_close(got, want, dtype):
    for name, g, w in zip("qkv", got, want):
        assert g.dtype == dtype and g.shape == w.shape, name
        g = g.double().cpu()
        assert not torch.isnan(g).any(), f"d{name} has NaN"
        err = (g - w).norm() / w.norm().clamp_min(1e-30)
        assert err < rel_tol(dtype), f"d{name}: relative error {err:.3e}"


def check(q, k, v, m, block_size, is_causal=False, scale=None, with_lse=True, seed=0,
          grad_out=None):
    g = torch.Generator().manual_seed(seed + 100)
    B, H, Lq, _ = q.shape
    if grad_out is None:
        grad_out = torch.randn(B, H, Lq, v.shape[-1], generator=g).to(q.dtype).to(q.device)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    grad_lse = torch.randn(B, H, Lq, generator=g).to(lse_dtype).to(q.device) if with_lse else None
    got = grads(q, k, v, m, block_size, grad_out, grad_lse, is_causal, scale)
    want = reference_grads(q, k, v, dense_mask(m, q, k, block_size, is_causal), grad_out, grad_lse,
                           scale)
    assert_grads_close(got, want, q.dtype)
    return got


# ---------------------------------------------------------------- correctness


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [16, 48, 64, 80, 128, 256])
def test_dtypes_and_head_dims(device, dtype, D):
    # Lengths not multiples of the block, Lq != Lk, causal on every other D.
    q, k, v = inputs(1, 2, 2, 150, 231, D, D, dtype, device)
    m = random_mask(1, 2, 150, 231, 64, device)
    check(q, k, v, m, 64, is_causal=D in (64, 128, 256))


@pytest.mark.parametrize("block_size", [(16, 32), 64, (128, 64), 1, (7, 300)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("is_causal", [False, True])
def test_block_sizes(device, block_size, dtype, is_causal):
    q, k, v = inputs(2, 2, 1, 200, 270, 64, 64, dtype, device, seed=1)
    m = random_mask(2, 2, 200, 270, block_size, device, seed=2)
    check(q, k, v, m, block_size, is_causal=is_causal)


@pytest.mark.parametrize("dims", [(32, 48), (64, 128), (80, 16)])
def test_value_dim_differs(device, dims):
    D, Dv = dims
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = inputs(1, 2, 2, 70, 90, D, Dv, dtype, device)
        check(q, k, v, random_mask(1, 2, 70, 90, 16, device), 16, is_causal=True)


@pytest.mark.parametrize("Hkv", [1, 2, 4])
def test_grouped_query_attention(device, Hkv):
    # dk and dv sum over the query heads that share a key head.
    for dtype in (torch.float16, torch.float32):
        q, k, v = inputs(2, 4, Hkv, 130, 130, 64, 64, dtype, device, seed=Hkv)
        check(q, k, v, random_mask(2, 4, 130, 130, 64, device, seed=Hkv), 64, is_causal=True)


def test_scale_and_no_lse_gradient(device):
    q, k, v = inputs(1, 2, 2, 70, 90, 64, 64, torch.float32, device)
    m = random_mask(1, 2, 70, 90, 32, device)
    for scale in (0.3, -0.05, 0.0):
        check(q, k, v, m, 32, scale=scale)
    check(q, k, v, m, 32, with_lse=False)


def test_only_lse_used(device):
    # grad_out is None: the gradient flows through lse alone.
    q, k, v = (t.requires_grad_() for t in inputs(1, 2, 1, 50, 60, 16, 16, torch.float64, device))
    m = random_mask(1, 2, 50, 60, 16, device)
    _, lse = bt.block_sparse_attention(q, k, v, m, block_size=16, return_lse=True)
    w = torch.randn(lse.shape, dtype=lse.dtype, device=device)
    got = torch.autograd.grad((lse * w).sum(), (q, k, v))
    dense = dense_mask(m, q, k, 16, False)
    want = reference_grads(q, k, v, dense, torch.zeros(1, 2, 50, 16), w)
    assert_grads_close(got, want, torch.float64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_empty_rows_get_zero_gradients(device, dtype):
    q, k, v = inputs(1, 2, 2, 192, 200, 64, 64, dtype, device)
    m = torch.ones(1, 2, 3, 4, dtype=torch.bool, device=device)
    m[0, 0, 1] = False           # a whole query block of head 0 sees nothing
    m[0, 1, :, :] = False
    m[0, 1, 2, 3] = True         # head 1: only the last (tail) key block, last query block
    dq, dk, dv = check(q, k, v, m, 64)
    assert (dq[0, 0, 64:128] == 0).all() and (dq[0, 1, :128] == 0).all()
    assert (dk[0, 1, :192] == 0).all() and (dv[0, 1, :192] == 0).all()
    # Causal: rows whose only visible block lies after them are empty too.
    mc = torch.zeros(1, 1, 3, 4, dtype=torch.bool, device=device)
    mc[..., 0, 1] = True
    dq, dk, dv = check(q, k, v, mc, 64, is_causal=True)
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all()


def test_empty_lengths(device):
    q, k, v = (t.requires_grad_() for t in inputs(1, 2, 2, 0, 10, 16, 16, torch.float32, device))
    out = bt.block_sparse_attention(q, k, v, torch.ones(1, 1, 0, 1, dtype=torch.bool, device=device))
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert dq.shape == q.shape and (dk == 0).all() and (dv == 0).all() and dk.shape == k.shape
    q, k, v = (t.requires_grad_() for t in inputs(1, 2, 2, 10, 0, 16, 16, torch.float32, device))
    out = bt.block_sparse_attention(q, k, v, torch.ones(1, 1, 1, 0, dtype=torch.bool, device=device))
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert (dq == 0).all() and dk.shape == k.shape and dv.shape == v.shape


def test_broadcast_masks(device):
    q, k, v = inputs(2, 3, 3, 130, 190, 64, 64, torch.float16, device)
    for shape in [(1, 1), (2, 1), (1, 3)]:
        m = random_mask(*shape, 130, 190, 64, device, seed=sum(shape))
        got = check(q, k, v, m, 64)
        again = grads(q, k, v, m.expand(2, 3, -1, -1), 64,
                      *_cotangents(q, v, seed=0))
        for a, b in zip(got, again):
            assert torch.equal(a, b)


def _cotangents(q, v, seed):
    g = torch.Generator().manual_seed(seed + 100)
    B, H, Lq, _ = q.shape
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return (torch.randn(B, H, Lq, v.shape[-1], generator=g).to(q.dtype).to(q.device),
            torch.randn(B, H, Lq, generator=g).to(lse_dtype).to(q.device))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_strided_inputs_and_grad_out(device, dtype):
    B, H, L, D = 2, 4, 150, 64
    g = torch.Generator().manual_seed(5)
    # [B, L, H, D] storage viewed as [B, H, L, D] (the usual projection output).
    q = torch.randn(B, L, H, D, generator=g).to(dtype).to(device).transpose(1, 2)
    # Every other element of the head dim.
    k = torch.randn(B, 2, L, 2 * D, generator=g).to(dtype).to(device)[..., ::2]
    # A storage offset of one element: rows not 16-byte aligned.
    v = torch.randn(B * 2 * L * D + 1, generator=g).to(dtype).to(device)[1:].view(B, 2, L, D)
    m = random_mask(B, H, L, L, 64, device)
    grad_out = torch.randn(B, L, H, D, generator=g).to(dtype).to(device).transpose(1, 2)
    check(q, k, v, m, 64, is_causal=True, grad_out=grad_out)
    # Expanded (stride-0) key heads: autograd sums the gradient of the expand.
    k1 = torch.randn(B, 1, L, D, generator=g).to(dtype).to(device).expand(B, 2, L, D)
    check(q, k1, v, m, 64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_off_blocks_never_reach_gradients(device, dtype):
    q, k, v = inputs(1, 2, 2, 256, 320, 64, 64, dtype, device)
    m = random_mask(1, 1, 256, 320, 64, device, density=0.5, seed=3)
    m[..., 1] = False
    m[..., 3] = False
    m[..., 0, 0] = True
    poisoned_k, poisoned_v = k.clone(), v.clone()
    for kb in (1, 3):
        poisoned_k[:, :, kb * 64:(kb + 1) * 64] = float("nan")
        poisoned_v[:, :, kb * 64:(kb + 1) * 64] = float("nan")
    cot = _cotangents(q, v, seed=1)
    clean = grads(q, k, v, m, 64, *cot)
    poisoned = grads(q, poisoned_k, poisoned_v, m, 64, *cot)
    assert torch.equal(clean[0], poisoned[0])
    for a, b in zip(clean[1:], poisoned[1:]):
        off = torch.zeros(320, dtype=torch.bool)
        off[64:128] = off[192:256] = True
        assert (b[:, :, off.to(device)] == 0).all()
        assert torch.equal(a[:, :, ~off.to(device)], b[:, :, ~off.to(device)])


# ---------------------------------------------------------------- NaN


@pytest.mark.parametrize("dtype,D,block_size", [(torch.float32, 32, 32), (torch.bfloat16, 64, 64),
                                                (torch.float16, 128, 128)])
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_reaches_the_rows_it_touches(device, dtype, D, block_size, where):
    """One NaN element: a NaN in q row i touches row i, one in key / value j
    the rows that see j. Those rows' out (for v, the NaN's column) and dq are
    NaN, and their lse with a NaN score; every other row stays finite."""
    L, at = 256, 37
    q, k, v = inputs(1, 2, 2, L, L, D, D, dtype, device, seed=9)
    m = random_mask(1, 2, L, L, block_size, device, density=0.5, seed=10)
    m[0, 0, at // block_size, at // block_size] = True
    dense = dense_mask(m, q, k, block_size, False)[0].to(device)  # [H, L, L]
    bad = {"q": q, "k": k, "v": v}
    bad[where] = bad[where].clone()
    bad[where][0, 0, at, 3] = float("nan")
    touched = torch.zeros(2, L, dtype=torch.bool, device=device)
    if where == "q":
        touched[0, at] = True
    else:
        touched[0] = dense[0, :, at]
    qq, kk, vv = (bad[n].detach().requires_grad_() for n in "qkv")
    out, lse = bt.block_sparse_attention(qq, kk, vv, m, block_size=block_size, return_lse=True)
    out_nan = torch.isnan(out[0])
    if where == "v":
        assert torch.equal(out_nan[..., 3], touched) and not out_nan[..., :3].any()
        assert not torch.isnan(lse).any()
    else:
        assert torch.equal(out_nan.all(-1), touched) and torch.equal(out_nan.any(-1), touched)
        assert torch.equal(torch.isnan(lse[0]), touched)
    dq, dk, dv = torch.autograd.grad(out, (qq, kk, vv), torch.ones_like(out))
    assert torch.equal(torch.isnan(dq[0]).any(-1), touched)
    assert torch.isnan(dq[0][touched]).all()

# ---------------------------------------------------------------- wgmma backward


def check_causal_and_not_twice(q, k, v, m, block_size):
    """check() without and with causal attention, each twice: the same bits."""
    for is_causal in (False, True):
        first = check(q, k, v, m, block_size, is_causal=is_causal)
        again = check(q, k, v, m, block_size, is_causal=is_causal)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


def _hopper(device):
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


@pytest.mark.parametrize("block_size", [64, 128, (128, 64), (64, 128), (256, 128)])
@pytest.mark.parametrize("D", [64, 128])
# float16 runs the bfloat16 kernels' code with the other conversion and MMA
# type: the slow tier, as is the generic executor on these shapes (other
# tests cover it).
@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("path", ["wgmma", "two_kernel", pytest.param("generic", marks=pytest.mark.slow)])
def test_tensor_core_shapes_backward(device, monkeypatch, block_size, D, dtype, path):
    """The shapes the Hopper wgmma backward takes (by default on Hopper: one
    fused pass at D 128 with key blocks of 128, else two kernels), its
    two-kernel form, and the generic executor on them with wgmma disabled:
    uneven lengths, Lq != Lk, GQA, causal and not, empty query blocks,
    grad_lse; bit-identical on a second run."""
    if not _hopper(device):
        pytest.skip("the wgmma backward runs on Hopper GPUs")
    if path == "generic":
        monkeypatch.setenv("BARACUDA_DISABLE_WGMMA", "1")
    if path == "two_kernel":
        if D != 128 or (block_size if isinstance(block_size, int) else block_size[1]) % 128:
            pytest.skip("the default is the two-kernel backward here")
        monkeypatch.setenv("BARACUDA_HOPPER_TWO_KERNEL_BACKWARD", "1")
    q, k, v = inputs(2, 4, 2, 300, 517, D, D, dtype, device, seed=D)
    m = random_mask(2, 4, 300, 517, block_size, device, density=0.6, seed=D + 1)
    m[:, :, 1] = False  # query blocks that see nothing
    check_causal_and_not_twice(q, k, v, m, block_size)


def test_wgmma_backward_many_items_and_nan(device):
    """More work items than resident CTAs (the persistent grids' counters
    restart on every call), strided inputs, and a NaN reaching its rows."""
    if not _hopper(device):
        pytest.skip("the wgmma backward runs on Hopper GPUs")
    q, k, v = inputs(3, 16, 4, 1100, 900, 128, 128, torch.bfloat16, device, seed=11)
    m = random_mask(3, 16, 1100, 900, 128, device, density=0.4, seed=12)
    check(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, m, 128, is_causal=True)
    bad = q.clone()
    bad[0, 0, 5, 7] = float("nan")
    qq = bad.requires_grad_()
    out = bt.block_sparse_attention(qq, k, v, m, block_size=128)
    dq, = torch.autograd.grad(out, qq, torch.ones_like(out))
    sees = m[0, 0, 0].any()
    assert bool(torch.isnan(dq[0, 0, 5]).all()) == bool(sees)
    assert not torch.isnan(dq[0, 0, 6:]).any() and not torch.isnan(dq[1:]).any()


def test_fused_backward_order_at_scale(device, monkeypatch):
    """Many key tiles adding into each query tile's dQ, more items than
    resident CTAs, dense, causal and sparse: the fused pass is bit-identical
    run to run and agrees with the two-kernel backward."""
    if not _hopper(device):
        pytest.skip("the wgmma backward runs on Hopper GPUs")
    q, k, v = inputs(2, 8, 4, 3000, 3100, 128, 128, torch.bfloat16, device, seed=21)
    go = torch.randn(q.shape, device=device, dtype=q.dtype,
                     generator=torch.Generator(device=device).manual_seed(22))
    sparse = random_mask(2, 8, 3000, 3100, 128, device, density=0.15, seed=23)
    for m, is_causal in ((None, False), (None, True), (sparse, False)):
        runs = []
        for two_kernel in ("0", "0", "1"):
            monkeypatch.setenv("BARACUDA_HOPPER_TWO_KERNEL_BACKWARD", two_kernel)
            runs.append(grads(q, k, v, m, 128, go, is_causal=is_causal))
        for a, b, c in zip(*runs):
            assert torch.equal(a, b)
            err = (a.double() - c.double()).norm() / c.double().norm()
            assert err < 1e-2, f"fused against two kernels: relative difference {err:.3e}"


# ---------------------------------------------------------------- compositions


def test_split_kv_merged_equals_full_attention(device):
    """Attention over two halves of the keys, merged with merge_state through
    the lse, trains like attention over all keys: its gradients flow through
    both lse outputs."""
    for dtype in (torch.float64, torch.bfloat16):
        q, k, v = inputs(2, 4, 2, 96, 256, 64, 64, dtype, device, seed=4)
        m = random_mask(2, 4, 96, 256, 64, device, density=0.7, seed=5)
        m[..., 0] = True  # every row sees a key in each half
        m[..., 2] = True
        go = torch.randn(2, 4, 96, 64, dtype=torch.float64).to(dtype).to(device)

        def split(q, k, v):
            o1, l1 = bt.block_sparse_attention(q, k[:, :, :128], v[:, :, :128], m[..., :2],
                                               return_lse=True)
            o2, l2 = bt.block_sparse_attention(q, k[:, :, 128:], v[:, :, 128:], m[..., 2:],
                                               return_lse=True)
            return bt.merge_state(o1, l1, o2, l2, lse_base="e")[0]

        def full(q, k, v):
            return bt.block_sparse_attention(q, k, v, m)

        results = []
        for f in (split, full):
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            out = f(qq, kk, vv)
            results.append((out, *torch.autograd.grad(out, (qq, kk, vv), go)))
        want = reference_grads(q, k, v, dense_mask(m, q, k, 64, False), go, None)
        for got in results:
            assert_grads_close(got[1:], want, dtype)
        tol = dict(atol=1e-10, rtol=1e-10) if dtype == torch.float64 else dict(atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(results[0][0], results[1][0], **tol)


def test_gradcheck(device):
    g = torch.Generator().manual_seed(3)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device).requires_grad_()  # noqa: E731
    q, k, v = mk(1, 4, 9, 6), mk(1, 2, 13, 6), mk(1, 2, 13, 5)
    m = random_mask(1, 4, 9, 13, (4, 5), device, density=0.7, seed=1)
    m[..., 0] = True  # every row sees a key: an empty row's lse (-inf) has no finite difference
    for is_causal in (False, True):
        def f(q, k, v):
            return bt.block_sparse_attention(q, k, v, m, block_size=(4, 5), is_causal=is_causal,
                                             return_lse=True)
        assert torch.autograd.gradcheck(f, (q, k, v))


def test_determinism(device):
    q, k, v = inputs(2, 4, 2, 300, 300, 64, 64, torch.bfloat16, device, seed=6)
    m = random_mask(2, 4, 300, 300, 64, device, seed=7)
    cot = _cotangents(q, v, seed=2)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first = grads(q, k, v, m, 64, *cot, is_causal=True)
        second = grads(q, k, v, m, 64, *cot, is_causal=True)
    finally:
        torch.use_deterministic_algorithms(was)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_double_backward_raises(device):
    q, k, v = (t.requires_grad_() for t in inputs(1, 2, 2, 20, 20, 8, 8, torch.float64, device))
    out = bt.block_sparse_attention(q, k, v, masks.causal(20, 20, 8, device=device), block_size=8)
    dq, = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        dq.sum().backward()


# ---------------------------------------------------------------- torch integration


def test_opcheck(device):
    q, k, v = inputs(1, 2, 1, 70, 50, 16, 16, torch.float32, device)
    m = random_mask(1, 2, 70, 50, 32, device)
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    opcheck(torch.ops.baracuda.block_sparse_attention.default, (q, k, v, m, 32, 32, None, True))
    out, lse = torch.ops.baracuda.block_sparse_attention(q, k, v, m, 32, 32, None, True)
    go, gl = torch.randn_like(out), torch.randn_like(lse)
    args = (go, gl, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), m, 32, 32, None, True)
    opcheck(torch.ops.baracuda.block_sparse_attention_backward.default, args)
    opcheck(torch.ops.baracuda.block_sparse_attention_backward.default,
            (go, None) + args[2:])


def test_compiled_training_step_no_recompile(device):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def step(q, k, v, m):
        out, lse = bt.block_sparse_attention(q, k, v, m, block_size=32, is_causal=True,
                                             return_lse=True)
        return (out * 2).sum() + lse.sum()

    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    for L, density in ((70, 0.5), (130, 0.8), (190, 0.3)):
        q, k, v = inputs(1, 2, 2, L, L, 16, 16, torch.float32, device, seed=L)
        m = random_mask(1, 2, L, L, 32, device, density=density, seed=L)
        qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
        compiled(qc, kc, vc, m).backward()
        qe, ke, ve = (t.clone().requires_grad_() for t in (q, k, v))
        step(qe, ke, ve, m).backward()
        for a, b in zip((qc, kc, vc), (qe, ke, ve)):
            torch.testing.assert_close(a.grad, b.grad)
    assert counter.frame_count == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory is measured on CUDA")
def test_backward_memory_does_not_grow_with_lq_times_lk():
    L, D = 32768, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 2, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
               .requires_grad_() for _ in range(3))
    m = masks.sliding_window(L, L, 1024, 128, sink_blocks=1, device="cuda")
    out = bt.block_sparse_attention(q, k, v, m, block_size=128, is_causal=True)
    go = torch.randn_like(out)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), go)
    torch.cuda.synchronize()
    grown = torch.cuda.max_memory_allocated() - before
    per_tensor = q.numel() * q.element_size()
    # The three gradients and per-row scratch, nothing of size L x L (GiB).
    assert grown <= 3 * per_tensor + 3 * per_tensor + (8 << 20)
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()


# ---------------------------------------------------------------- errors


def test_errors(device):
    q, k, v = inputs(1, 4, 2, 100, 120, 16, 16, torch.float32, device)
    m = random_mask(1, 4, 100, 120, 32, device)
    out, lse = bt.block_sparse_attention(q, k, v, m, block_size=32, return_lse=True)
    bw = torch.ops.baracuda.block_sparse_attention_backward
    go = torch.randn_like(out)
    with pytest.raises(RuntimeError, match=r"block_sparse_attention_backward: grad_out.shape=\[1, 4, 100, 8\] must be"):
        bw(go[..., :8], None, q, k, v, out, lse, m, 32, 32)
    with pytest.raises(RuntimeError, match=r"block_sparse_attention_backward: lse.dtype=Double must be Float"):
        bw(go, None, q, k, v, out, lse.double(), m, 32, 32)
    with pytest.raises(RuntimeError, match=r"block_sparse_attention_backward: grad_lse.shape=\[1, 4, 99\]"):
        bw(go, lse[..., 1:], q, k, v, out, lse, m, 32, 32)
    with pytest.raises(RuntimeError, match=r"block_sparse_attention_backward: block_mask.shape=\[1, 4, 4, 3\]"):
        bw(go, None, q, k, v, out, lse, m[..., :3], 32, 32)
    with pytest.raises(RuntimeError, match=r"block_sparse_attention_backward: out.shape="):
        bw(go, None, q, k, v, out[:, :, 1:], lse, m, 32, 32)
