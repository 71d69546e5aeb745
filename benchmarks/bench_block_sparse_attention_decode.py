"""Block-sparse attention for inference: a few queries per sequence over a
long KV cache, against SDPA's flash and cuDNN backends (bf16, q ``[B, 32,
Lq, 128]``, cache ``[B, 8, Lk, 128]``: grouped-query attention 4:1).

Ours reads the cache through ``kv_lens`` (every row full here, so that both
sides do the same work); SDPA gets ``enable_gqa=True``. Bytes are the cache
bytes read (K and V), so "% of roofline" is the share of the copy bandwidth
the cache streams at. Also: ragged lengths (uniform in ``[1, Lk]``, ours only:
its bytes are the keys actually read) and a CUDA-graph decode step, the
append of one token with ``write_slice_at_`` plus the attention, per token.
"""

import torch
import torch.nn.functional as F

import baracuda_torch as bt
from common import Case

H, HKV, D = 32, 8, 128
SHAPES = [(64, 1, 4096), (8, 1, 32768), (64, 16, 4096)]


def _sdpa(q, k, v, backend):
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def _cache_bytes(keys_read: int) -> int:
    return keys_read * HKV * D * 2 * 2  # K and V, bf16


def cases(device, quick=False):
    from torch.nn.attention import SDPBackend

    dtype = torch.bfloat16
    out = []
    for B, Lq, Lk in SHAPES if not quick else [(2, 1, 1024)]:
        q = torch.randn(B, H, Lq, D, device=device, dtype=dtype)
        k, v = (torch.randn(B, HKV, Lk, D, device=device, dtype=dtype) for _ in range(2))
        full = torch.full((B,), Lk, device=device, dtype=torch.int32)
        ours = lambda q=q, k=k, v=v, n=full: bt.block_sparse_attention(  # noqa: E731
            q, k, v, kv_lens=n)
        name = f"decode q [{B}, {H}, {Lq}, {D}], cache [{B}, {HKV}, {Lk}, {D}]"
        if device.type == "cuda":
            for backend, label in ((SDPBackend.FLASH_ATTENTION, "flash"),
                                   (SDPBackend.CUDNN_ATTENTION, "cuDNN")):
                peer = lambda q=q, k=k, v=v, b=backend: _sdpa(q, k, v, b)  # noqa: E731
                out.append(Case(name, dtype="bfloat16", bytes_moved=_cache_bytes(B * Lk),
                                ours=ours, peer=peer, peer_name=f"SDPA, {label} backend",
                                reps=50))
        else:
            out.append(Case(name, dtype="bfloat16", bytes_moved=_cache_bytes(B * Lk), ours=ours))
        if Lq == 1 and B == 64 or quick:
            g = torch.Generator().manual_seed(0)
            ragged = torch.randint(1, Lk + 1, (B,), generator=g).to(device=device,
                                                                     dtype=torch.int32)
            out.append(Case(f"{name}, ragged lengths in [1, {Lk}]", dtype="bfloat16",
                            bytes_moved=_cache_bytes(int(ragged.sum())),
                            ours=lambda q=q, k=k, v=v, n=ragged: bt.block_sparse_attention(
                                q, k, v, kv_lens=n), reps=50))
            if device.type == "cuda":
                out.append(_graph_step(q, k, v, name))
    return out


def _graph_step(q, k, v, name):
    """One decode step as a model runs it, replayed from a CUDA graph: append
    the new token's K and V at each row's length, attend with the length
    plus one (bottom-right causal)."""
    B = q.shape[0]
    k_new, v_new = torch.randn_like(k[:, :, :1]), torch.randn_like(v[:, :, :1])
    lens = torch.full((B,), k.shape[2] - 1, device=q.device, dtype=torch.int64)
    attended = lens + 1

    def step():
        bt.write_slice_at_(k, k_new, 2, lens)
        bt.write_slice_at_(v, v_new, 2, lens)
        return bt.block_sparse_attention(q, k, v, is_causal=True, causal_align="bottom_right",
                                         kv_lens=attended)

    return Case(f"{name}, CUDA-graph step: append + attend", dtype="bfloat16",
                bytes_moved=_cache_bytes(B * k.shape[2]), ours=step, graph=True, reps=50)
