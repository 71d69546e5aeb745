"""Main-job rows of block-sparse attention, forward and backward: float64
SDPA with the equivalent dense mask as reference, dense-masked SDPA in the
input dtype as the timed peer (what a user without block sparsity would
call). Backward rows compare the gradients of q, k and v (flattened one
after the other) for one fixed output gradient; their peer is SDPA's
backward on the same mask."""

import math

import torch
import torch.nn.functional as F

import baracuda_torch as bt
from baracuda_torch import masks

from . import Check


def _reference(q, k, v, m, block_size, is_causal):
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    dense = masks.to_dense(m, q.shape[2], k.shape[2], block_size, is_causal=is_causal)
    out = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=dense)
    return out.masked_fill(~dense.any(-1, keepdim=True), 0.0)  # empty rows: 0, not NaN


def _inputs(device, dtype, seed, *shapes):
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(*s, generator=g, device=device).to(dtype) for s in shapes]


def _case(device, dtype, B, H, Hkv, L, D, pattern, block_size, is_causal):
    q, k, v = _inputs(device, dtype, 0, (B, H, L, D), (B, Hkv, L, D), (B, Hkv, L, D))
    m = pattern(L).to(device)
    dense = masks.to_dense(m, L, L, block_size, is_causal=is_causal)
    group = H // Hkv
    kp, vp = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    tol = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 5e-5, torch.float64: 1e-10}[dtype]
    name = "block_sparse_attention" + (" causal" if is_causal else "")
    return Check(name, dtype, f"{B}x{H}x{L}x{D} kv{Hkv} blk{block_size}",
                 lambda: bt.block_sparse_attention(q, k, v, m, block_size=block_size, is_causal=is_causal),
                 lambda: _reference(q, k, v, m, block_size, is_causal),
                 lambda: F.scaled_dot_product_attention(q, kp, vp, attn_mask=dense),
                 tolerance=tol)


def _grads(attention, q, k, v, grad_out):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    dq, dk, dv = torch.autograd.grad(attention(q, k, v), (q, k, v), grad_out)
    return torch.cat([dq.flatten(), dk.flatten(), dv.flatten()])


def _backward_case(device, dtype, B, H, Hkv, L, D, pattern, block_size, is_causal):
    q, k, v, grad_out = _inputs(device, dtype, 1, (B, H, L, D), (B, Hkv, L, D), (B, Hkv, L, D),
                                (B, H, L, D))
    m = pattern(L).to(device)
    dense = masks.to_dense(m, L, L, block_size, is_causal=is_causal)
    group = H // Hkv

    def ours(q, k, v):
        return bt.block_sparse_attention(q, k, v, m, block_size=block_size, is_causal=is_causal)

    def reference(q, k, v):
        # By plain ops, so that rows that see no key (SDPA's NaN) get zero gradients.
        kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        s = (q @ kr.transpose(-1, -2) / math.sqrt(D)).masked_fill(~dense, -math.inf)
        s = s.masked_fill(~dense.any(-1, keepdim=True), 0.0)
        return torch.softmax(s, -1).mul(dense) @ vr

    def peer(q, k, v):
        kp, vp = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return F.scaled_dot_product_attention(q, kp, vp, attn_mask=dense)

    # Gradients are sums over up to L keys of products of O(1) values: the
    # tolerance scales with the row length (half types round each gradient).
    tol = {torch.bfloat16: 1e-1, torch.float16: 2e-2, torch.float32: 2e-4, torch.float64: 1e-9}[dtype]
    name = "block_sparse_attention backward" + (" causal" if is_causal else "")
    return Check(name, dtype, f"{B}x{H}x{L}x{D} kv{Hkv} blk{block_size}",
                 lambda: _grads(ours, q, k, v, grad_out),
                 lambda: _grads(reference, q.double(), k.double(), v.double(), grad_out.double()),
                 lambda: _grads(peer, q, k, v, grad_out),
                 tolerance=tol)


def checks(device):
    L = 2048 if device.type == "cuda" else 256
    window = lambda bs: lambda n: masks.sliding_window(n, n, n // 4, bs, sink_blocks=1)  # noqa: E731
    rand = lambda bs, heads: lambda n: masks.random(n, n, bs, density=0.3, heads=heads,  # noqa: E731
                                                    generator=torch.Generator().manual_seed(1))
    return [
        _case(device, torch.bfloat16, 1, 8, 8, L, 128, window(128), 128, True),
        _case(device, torch.float16, 1, 8, 2, L, 64, rand(64, 8), 64, False),
        _case(device, torch.bfloat16, 1, 8, 8, L, 128, lambda n: masks.causal(n, n, 64), 64, True),
        _case(device, torch.float32, 1, 4, 4, L // 2, 80, rand(32, 4), 32, False),
        _case(device, torch.float64, 1, 2, 1, 130, 16, window(16), 16, True),
        _backward_case(device, torch.bfloat16, 1, 4, 2, L // 2, 64, window(64), 64, True),
        _backward_case(device, torch.float32, 1, 4, 4, L // 4, 48, rand(32, 4), 32, False),
        _backward_case(device, torch.float64, 1, 2, 1, 130, 16, window(16), 16, True),
    ]
