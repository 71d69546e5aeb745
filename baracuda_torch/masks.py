"""Block masks for :func:`baracuda_torch.block_sparse_attention`.

Every builder returns a bool tensor ``[batch or 1, heads or 1, nbq, nbk]``
with ``nbq = ceil(q_len / block_q)`` and ``nbk = ceil(k_len / block_k)``
(``block_size`` is an int or ``(block_q, block_k)``): a True tile is computed,
a False tile is skipped. Size-1 axes broadcast over batch and heads.

Masks are block-granular: a pattern whose edge falls inside a tile (a window
of 1000 keys at block 128, say) keeps the whole tile. The causal diagonal is
the exception: pass ``is_causal=True`` to the attention call and the diagonal
tiles are masked element by element.

Switching from FlexAttention is one line::

    mask = masks.from_flex(flex_block_mask)      # at flex_block_mask.BLOCK_SIZE
    out = block_sparse_attention(q, k, v, mask, block_size=flex_block_mask.BLOCK_SIZE)
"""

import math
from typing import Optional

import torch
from torch import Tensor

from .block_sparse_attention import BlockSize, block_sizes


def num_blocks(q_len: int, k_len: int, block_size: BlockSize):
    """``(nbq, nbk)``: the mask's last two sizes for these lengths."""
    bq, bk = block_sizes(block_size)
    return math.ceil(q_len / bq), math.ceil(k_len / bk)


def _spans(length, block, device):
    """First and last index of every block of a ``length``-long axis, as
    columns/rows ready to broadcast."""
    first = torch.arange(0, math.ceil(length / block), device=device) * block
    last = torch.clamp(first + block, max=length) - 1
    return first, last


def _grid(q_len, k_len, block_size, device):
    bq, bk = block_sizes(block_size)
    qf, ql = _spans(q_len, bq, device)
    kf, kl = _spans(k_len, bk, device)
    return qf[:, None], ql[:, None], kf[None, :], kl[None, :]


def _as_4d(m: Tensor) -> Tensor:
    return m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))


def causal(q_len: int, k_len: int, block_size: BlockSize = 64, *, device=None) -> Tensor:
    """Tiles holding at least one pair with ``key <= query`` (top-left
    causal). Use it with ``is_causal=True`` so the diagonal tiles are masked
    per element."""
    qf, ql, kf, kl = _grid(q_len, k_len, block_size, device)
    return _as_4d(kf <= ql)


def with_causal(mask: Tensor, q_len: int, k_len: int, block_size: BlockSize) -> Tensor:
    """``mask`` without the tiles that lie wholly above the causal diagonal."""
    return mask & causal(q_len, k_len, block_size, device=mask.device)


def sliding_window(q_len: int, k_len: int, window: int, block_size: BlockSize = 64, *,
                   sink_blocks: int = 0, causal: bool = True, device=None) -> Tensor:
    """Local attention: tiles holding a pair with ``0 <= query - key < window``
    (``|query - key| < window`` with ``causal=False``), plus the first
    ``sink_blocks`` key blocks for every query block (attention sinks)."""
    if window <= 0:
        raise ValueError(f"window={window} must be positive")
    qf, ql, kf, kl = _grid(q_len, k_len, block_size, device)
    # The differences query - key inside a tile span [qf - kl, ql - kf].
    lowest = 0 if causal else -(window - 1)
    m = (ql - kf >= lowest) & (qf - kl <= window - 1)
    kb = torch.arange(kf.shape[1], device=device)[None, :]
    sink = kb < sink_blocks
    if causal:
        sink = sink & (kf <= ql)
    return _as_4d(m | sink)


def dilated(q_len: int, k_len: int, block_size: BlockSize = 64, *, dilation: int = 2,
            causal: bool = False, device=None) -> Tensor:
    """Every ``dilation``-th key block counted from the diagonal block:
    ``(query_block - key_block) % dilation == 0`` (strided attention)."""
    if dilation <= 0:
        raise ValueError(f"dilation={dilation} must be positive")
    qf, ql, kf, kl = _grid(q_len, k_len, block_size, device)
    qb = torch.arange(qf.shape[0], device=device)[:, None]
    kb = torch.arange(kf.shape[1], device=device)[None, :]
    m = (qb - kb) % dilation == 0
    if causal:
        m = m & (kf <= ql)
    return _as_4d(m)


def _random_choice(shape, nbk, count, generator, device):
    """``count`` distinct key blocks per row, uniformly at random."""
    if count <= 0 or nbk == 0:
        return torch.zeros(shape + (nbk,), dtype=torch.bool, device=device)
    scores = torch.rand(shape + (nbk,), generator=generator).to(device)
    picked = scores.topk(min(count, nbk), dim=-1).indices
    return torch.zeros(shape + (nbk,), dtype=torch.bool, device=device).scatter_(-1, picked, True)


def bigbird(q_len: int, k_len: int, block_size: BlockSize = 64, *, global_blocks: int = 1,
            window_blocks: int = 1, random_blocks: int = 2, batch: int = 1, heads: int = 1,
            generator: Optional[torch.Generator] = None, device=None) -> Tensor:
    """BigBird: the first ``global_blocks`` query and key blocks see / are
    seen by everything, each query block sees the key blocks within
    ``window_blocks`` of its own index, and ``random_blocks`` more chosen at
    random per batch, head and query block (``generator`` makes it
    reproducible). Shape ``[batch, heads, nbq, nbk]``."""
    nbq, nbk = num_blocks(q_len, k_len, block_size)
    qb = torch.arange(nbq, device=device)[:, None]
    kb = torch.arange(nbk, device=device)[None, :]
    fixed = (qb < global_blocks) | (kb < global_blocks) | ((qb - kb).abs() <= window_blocks)
    rand = _random_choice((batch, heads, nbq), nbk, random_blocks, generator, device)
    return fixed[None, None] | rand


def random(q_len: int, k_len: int, block_size: BlockSize = 64, *, density: float = 0.1,
           batch: int = 1, heads: int = 1, generator: Optional[torch.Generator] = None,
           device=None) -> Tensor:
    """Each tile on with probability ``density``, independently per batch and
    head. Shape ``[batch, heads, nbq, nbk]``."""
    nbq, nbk = num_blocks(q_len, k_len, block_size)
    return (torch.rand((batch, heads, nbq, nbk), generator=generator) < density).to(device)


def from_dense(mask: Tensor, block_size: BlockSize = 64) -> Tensor:
    """Tiles of a dense boolean mask ``[..., q_len, k_len]`` (at most 4-D,
    True = attend) that hold at least one True."""
    if mask.dim() < 2 or mask.dim() > 4:
        raise ValueError(f"mask.dim()={mask.dim()} must be 2, 3 or 4 ([..., q_len, k_len])")
    bq, bk = block_sizes(block_size)
    m = _as_4d(mask.bool())
    B, H, q_len, k_len = m.shape
    nbq, nbk = num_blocks(q_len, k_len, (bq, bk))
    padded = torch.nn.functional.pad(m, (0, nbk * bk - k_len, 0, nbq * bq - q_len))
    return padded.reshape(B, H, nbq, bq, nbk, bk).any(dim=5).any(dim=3)


def from_flex(block_mask) -> Tensor:
    """The tiles of a FlexAttention ``BlockMask`` (partial and full blocks
    alike), at its own ``BLOCK_SIZE``. Partial blocks are kept whole: a
    ``mask_mod`` that is not causal inside a tile is not reproduced (use
    ``is_causal=True`` for the causal one)."""
    bq, bk = block_mask.BLOCK_SIZE
    q_len, k_len = block_mask.seq_lengths
    nbq, nbk = num_blocks(q_len, k_len, (bq, bk))
    on = _tiles_of(block_mask.kv_num_blocks, block_mask.kv_indices, nbq, nbk)
    if block_mask.full_kv_num_blocks is not None:
        on = on | _tiles_of(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, nbq, nbk)
    return on


def _tiles_of(num, indices, nbq, nbk):
    """Dense [B, H, nbq, nbk] from Flex's (count, index list) per query block.
    Entries past the count are unused slots and may hold any index: they add 0."""
    num = num[..., :nbq].long()
    idx = indices[..., :nbq, :].long().clamp(0, max(nbk - 1, 0))
    used = torch.arange(idx.shape[-1], device=idx.device) < num[..., None]
    hits = torch.zeros(idx.shape[:-1] + (nbk,), dtype=torch.int32, device=idx.device)
    hits.scatter_add_(-1, idx, used.int())
    return hits > 0


def to_dense(block_mask: Tensor, q_len: int, k_len: int, block_size: BlockSize = 64, *,
             is_causal: bool = False) -> Tensor:
    """The element mask ``[B or 1, H or 1, q_len, k_len]`` that a block mask
    (4-D or flattened) means -- what to hand SDPA's ``attn_mask`` to get the
    same result. Allocates ``q_len x k_len``: for tests and small problems."""
    bq, bk = block_sizes(block_size)
    nbq, nbk = num_blocks(q_len, k_len, (bq, bk))
    m = block_mask.bool()
    if m.dim() == 3:
        m = m.reshape(m.shape[0], m.shape[1], nbq, nbk)
    dense = m.repeat_interleave(bq, dim=2)[:, :, :q_len].repeat_interleave(bk, dim=3)[..., :k_len]
    if is_causal:
        dense = dense & torch.ones(q_len, k_len, dtype=torch.bool, device=m.device).tril()
    return dense
