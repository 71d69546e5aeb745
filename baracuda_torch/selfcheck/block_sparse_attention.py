"""Main-job rows of block-sparse attention: float64 SDPA with the equivalent
dense mask as reference, dense-masked SDPA in the input dtype as the timed
peer (what a user without block sparsity would call)."""

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


def _case(device, dtype, B, H, Hkv, L, D, pattern, block_size, is_causal):
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, H, L, D, generator=g, device=device).to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=g, device=device).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g, device=device).to(dtype)
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
    ]
