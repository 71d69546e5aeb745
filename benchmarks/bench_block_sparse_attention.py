"""Block-sparse attention benchmark cases (bf16, B=4, H=16, L=8192, D 128 and 64).

Patterns: all blocks on, causal, sliding window 1024 + one sink block, and
random 10 % of blocks, each at block 128 and block 64. Peers, on the same
mask: FlexAttention (``torch.compile(flex_attention)`` with a ``BlockMask``
built from our block mask, so both skip the same tiles) and dense
``F.scaled_dot_product_attention`` (``is_causal`` for the causal patterns,
no mask otherwise -- the cost of ignoring the sparsity), twice: restricted to
its flash backend, and with the backend torch picks by default (cuDNN's
attention on an H100 with recent torch, faster than flash there).
Throughput is TFLOP/s on the pairs actually computed
(``baracuda_torch.attention_flops``). First-call latency of ours and of Flex
(its compile) is reported in each pattern's note.
"""

import time

import torch
import torch.nn.functional as F

import baracuda_torch as bt
from baracuda_torch import masks
from common import Case

_flex = None


def flex():
    global _flex
    if _flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _flex = torch.compile(flex_attention, dynamic=False)
    return _flex


def flex_block_mask(m, L, block_size, is_causal):
    """The same tiles as a FlexAttention BlockMask (``m``: [B, H, nb, nb]):
    every tile full, except the diagonal tiles of a causal pattern, which are
    partial. The mask_mod repeats the block mask element-wise, so that Flex's
    own dense fallbacks agree too; its kernel never evaluates it on full tiles."""
    from torch.nn.attention.flex_attention import BlockMask

    def as_lists(on):
        num = on.sum(-1, dtype=torch.int32)
        # Stable sort of ~on puts the indices of the True tiles first, in order.
        idx = torch.sort((~on).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
        return num, idx

    def mask_mod(b, h, q, kv):
        on = m[b, h, q // block_size, kv // block_size]
        return on & (q >= kv) if is_causal else on

    nb = m.shape[-1]
    qb = torch.arange(nb, device=m.device)[:, None]
    kb = torch.arange(nb, device=m.device)[None, :]
    partial = m & (qb == kb) if is_causal else torch.zeros_like(m)
    full = m & (kb < qb) if is_causal else m
    return BlockMask.from_kv_blocks(*as_lists(partial), *as_lists(full), BLOCK_SIZE=block_size,
                                    mask_mod=mask_mod, seq_lengths=(L, L))


def dense_sdpa(q, k, v, causal, flash_only):
    """Dense SDPA, restricted to the flash backend or on torch's default pick."""
    if not flash_only:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def first_call_ms(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def patterns(L, bs, B, H, device):
    g = torch.Generator().manual_seed(0)
    return [
        ("all blocks", torch.ones(1, 1, *masks.num_blocks(L, L, bs), dtype=torch.bool), False),
        ("causal", masks.causal(L, L, bs), True),
        ("sliding window 1024 + sink", masks.sliding_window(L, L, 1024, bs, sink_blocks=1), True),
        ("random 10%", masks.random(L, L, bs, density=0.1, batch=B, heads=H, generator=g), False),
    ]


def cases(device, quick=False):
    out = []
    for D in (128,) if quick else (128, 64):
        out += _cases_for_head_dim(device, D, quick)
    return out


def _cases_for_head_dim(device, D, quick):
    B, H, L = (1, 2, 1024) if quick else (4, 16, 8192)
    dtype = torch.bfloat16
    q, k, v = (torch.randn(B, H, L, D, device=device, dtype=dtype) for _ in range(3))
    on_cuda = device.type == "cuda"
    out = []
    for bs in (128, 64):
        for label, m, causal in patterns(L, bs, B, H, device):
            m = m.to(device)
            flops = bt.attention_flops(q, k, v, m, bs, is_causal=causal)
            sparsity = 1 - float(m.float().mean())
            ours = lambda m=m, bs=bs, c=causal: bt.block_sparse_attention(  # noqa: E731
                q, k, v, m, block_size=bs, is_causal=c)
            name = f"{label} blk{bs} [{B}, {H}, {L}, {D}]"
            note = f"{name}: {100 * sparsity:.0f}% of tiles off, {flops / 1e12:.2f} TFLOP computed"
            rows = []
            if on_cuda:
                note += f"; first call: ours {first_call_ms(ours):.1f} ms"
                bm = flex_block_mask(m.expand(B, H, -1, -1).contiguous(), L, bs, causal)
                # Flex's default tile is 128 x 128; a block-64 BlockMask needs tiles that
                # divide it.
                opts = {"BLOCK_M": bs, "BLOCK_N": bs} if bs < 128 else None
                peer_flex = lambda bm=bm, o=opts: flex()(q, k, v, block_mask=bm,  # noqa: E731
                                                         kernel_options=o)
                note += (f", Flex {first_call_ms(peer_flex):.0f} ms (it compiles when L or the mask's "
                         "shape is new to it, so only the first pattern of each block size pays)")
                rows.append(Case(name, dtype="bfloat16", bytes_moved=0, flops=flops, ours=ours,
                                 peer=peer_flex, peer_name="FlexAttention (compiled)", note=note,
                                 reps=20))
                note = ""
            for flash_only in (True, False):
                peer_sdpa = lambda c=causal, f=flash_only: dense_sdpa(q, k, v, c, f)  # noqa: E731
                peer_name = ("dense SDPA" + (" causal" if causal else "")
                             + (", flash backend" if flash_only else ", default backend"))
                rows.append(Case(name, dtype="bfloat16", bytes_moved=0, flops=flops, ours=ours,
                                 peer=peer_sdpa, peer_name=peer_name, note=note, reps=20))
                note = ""
            out += rows
            if quick:
                break
    return out
