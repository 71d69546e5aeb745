"""Host cost of a call: every family on small tensors, ours against torch's
own op (SDPA for attention, the eager formula for merge, which torch lacks),
forward alone and forward + backward (``torch.autograd.grad``).

On such sizes the kernels take a few microseconds, so the time per call is
what the host spends queuing it: argument checks, the dispatcher, the
autograd layer and the launches. The runner's timer measures each call from
the host's side (CUDA events around calls the host cannot queue ahead of),
so the columns read as host time per eager call.
"""

import torch
import torch.nn.functional as F

import baracuda_torch as bt
from common import Case


def _grad(fn, *inputs):
    """forward + backward: ``torch.autograd.grad`` of fn(*inputs) for a
    gradient of ones, kept across calls."""
    grad = torch.ones_like(fn(*inputs))
    return lambda: torch.autograd.grad(fn(*inputs), inputs, grad)


def _case(name, ours, peer, peer_name):
    return Case(name, dtype="float32", bytes_moved=0, ours=ours, peer=peer, peer_name=peer_name,
                reps=200)


def cases(device, quick=False):
    f32 = dict(device=device, dtype=torch.float32)
    out = []

    # write_slice: a decode-sized append into a small cache.
    cache = torch.zeros(4, 8, 64, 64, **f32)
    kv = torch.randn(4, 8, 1, 64, **f32)
    ranges = [(0, 4), (0, 8), (17, 18), (0, 64)]
    out.append(_case("write_slice_ [4, 8, 64, 64] one position",
                     lambda: bt.write_slice_(cache, kv, ranges),
                     lambda: cache[:, :, 17:18].copy_(kv), "slice copy_"))

    # Scans.
    x = torch.randn(32, 128, **f32)
    out.append(_case("cumsum [32, 128]", lambda: bt.cumsum(x, 1), lambda: torch.cumsum(x, 1),
                     "torch.cumsum"))
    xg = x.clone().requires_grad_()
    out.append(_case("cumsum forward + backward [32, 128]", _grad(lambda t: bt.cumsum(t, 1), xg),
                     _grad(lambda t: torch.cumsum(t, 1), xg), "torch.cumsum"))

    # Merge: no torch op; its eager formula.
    va, vb = torch.randn(16, 8, 64, **f32), torch.randn(16, 8, 64, **f32)
    sa, sb = torch.randn(16, 8, **f32), torch.randn(16, 8, **f32)

    def formula(va, sa, vb, sb):
        m = torch.maximum(sa, sb)
        wa, wb = torch.exp(sa - m), torch.exp(sb - m)
        return (wa[..., None] * va + wb[..., None] * vb) / (wa + wb)[..., None]

    out.append(_case("merge_state [16, 8, 64]",
                     lambda: bt.merge_state(va, sa, vb, sb, lse_base="e"),
                     lambda: formula(va, sa, vb, sb), "eager formula"))
    mg = [t.clone().requires_grad_() for t in (va, sa, vb, sb)]
    out.append(_case("merge_state forward + backward [16, 8, 64]",
                     _grad(lambda *t: bt.merge_state(*t, lse_base="e")[0], *mg),
                     _grad(formula, *mg), "eager formula"))

    # Fractional max pooling, with the same samples on both sides.
    p = torch.randn(2, 4, 32, 32, **f32)
    samples = torch.rand(2, 4, 2, **f32)
    ours_pool = lambda t: bt.fractional_max_pool2d(t, 2, (16, 16), _random_samples=samples)  # noqa: E731
    torch_pool = lambda t: F.fractional_max_pool2d(t, 2, (16, 16), _random_samples=samples)  # noqa: E731
    out.append(_case("fractional_max_pool2d [2, 4, 32, 32]", lambda: ours_pool(p),
                     lambda: torch_pool(p), "F.fractional_max_pool2d"))
    pg = p.clone().requires_grad_()
    out.append(_case("fractional_max_pool2d forward + backward [2, 4, 32, 32]",
                     _grad(ours_pool, pg), _grad(torch_pool, pg), "F.fractional_max_pool2d"))

    # Attention: every tile on, against SDPA.
    q, k, v = (torch.randn(1, 4, 64, 64, **f32) for _ in range(3))
    m = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    out.append(_case("block_sparse_attention [1, 4, 64, 64]",
                     lambda: bt.block_sparse_attention(q, k, v, m),
                     lambda: F.scaled_dot_product_attention(q, k, v), "SDPA"))
    ag = [t.clone().requires_grad_() for t in (q, k, v)]
    out.append(_case("block_sparse_attention forward + backward [1, 4, 64, 64]",
                     _grad(lambda *t: bt.block_sparse_attention(*t, m), *ag),
                     _grad(F.scaled_dot_product_attention, *ag), "SDPA"))
    return out
