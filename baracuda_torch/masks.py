"""Block masks for :func:`baracuda_torch.block_sparse_attention`.

The pattern builders (``causal``, ``sliding_window``, ``bigbird``,
``dilated``, ``random``) return a bool tensor ``[batch or 1, heads or 1, nbq,
nbk]`` with ``nbq = ceil(q_len / block_q)`` and ``nbk = ceil(k_len /
block_k)`` (``block_size`` is an int or ``(block_q, block_k)``): a True tile
is computed whole, a False tile is skipped. Size-1 axes broadcast over batch
and heads. Exact edges come from the attention call's own conditions
(``is_causal``, ``window``, ``document_ids``) or from an exact mask.

``from_dense`` and ``from_flex`` return an :class:`ExactMask`: tiles off,
full or partial, with a bit per element of the partial tiles, so attention
with it equals attention with the dense element mask. Its ``tiles`` field is
the tile-granular bool mask. Switching from FlexAttention is one line::

    out = block_sparse_attention(q, k, v, masks.from_flex(flex_block_mask))
"""

import math
from typing import Optional

import torch
from torch import Tensor

from .block_sparse_attention import BlockSize, ExactMask, block_sizes

__all__ = ["ExactMask", "bigbird", "causal", "dilated", "document_tiles", "exact", "from_dense",
           "from_flex", "num_blocks", "random", "sliding_window", "to_dense"]


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


def document_tiles(q_ids: Tensor, kv_ids: Tensor, block_size: BlockSize = 64) -> Tensor:
    """The tiles where some query and some key may share a document id:
    ``[B, 1, nbq, nbk]`` bool from ids ``[B or 1, Lq]`` and ``[B or 1, Lk]``.
    A tile is kept when the id ranges of its rows and its keys overlap, which
    never drops a pair with equal ids (and is exact for packed documents,
    whose ids rise along the sequence). Torch ops on the ids' device, no host
    sync. block_sparse_attention ANDs it into a tile mask by itself when given
    ``document_ids``, so the tiles between documents are skipped."""
    bq, bk = block_sizes(block_size)

    def ranges(ids, block):
        """Per block of positions, the least and greatest id; the last block
        is padded with its own last id, which changes neither."""
        n = -(-ids.shape[-1] // block)
        pad = ids[:, -1:].expand(ids.shape[0], n * block - ids.shape[-1])
        blocks = torch.cat([ids, pad], dim=1).long().view(ids.shape[0], n, block)
        return blocks.amin(-1), blocks.amax(-1)

    q_lo, q_hi = ranges(q_ids, bq)
    k_lo, k_hi = ranges(kv_ids, bk)
    return ((q_lo[:, :, None] <= k_hi[:, None, :]) & (k_lo[:, None, :] <= q_hi[:, :, None]))[:, None]


def from_dense(mask: Tensor, block_size: BlockSize = 64) -> ExactMask:
    """The exact mask of a dense boolean mask ``[..., q_len, k_len]`` (at
    most 4-D, True = attend): tiles with no True are off, tiles all True are
    full, the others partial with their bits. Built with torch ops on the
    mask's device (one host sync, to count the partial tiles)."""
    if mask.dim() < 2 or mask.dim() > 4:
        raise ValueError(f"mask.dim()={mask.dim()} must be 2, 3 or 4 ([..., q_len, k_len])")
    bq, bk = block_sizes(block_size)
    m = _as_4d(mask.bool())
    B, H, q_len, k_len = m.shape
    nbq, nbk = num_blocks(q_len, k_len, (bq, bk))
    # Padding reads as visible for "full" (elements past the ends do not
    # exist) and as hidden for "on" and for the bits.
    tiles_of = lambda t, value: torch.nn.functional.pad(  # noqa: E731
        t, (0, nbk * bk - k_len, 0, nbq * bq - q_len), value=value).reshape(
        B, H, nbq, bq, nbk, bk).permute(0, 1, 2, 4, 3, 5)
    on = tiles_of(m, False).any(dim=5).any(dim=4)
    full = tiles_of(m, True).all(dim=5).all(dim=4)
    return exact(on, on & ~full, lambda b, h, qb, kb: tiles_of(m, False)[b, h, qb, kb],
                 (bq, bk), q_len, k_len)


def exact(tiles: Tensor, partial: Tensor, tile_bits, block_size: BlockSize, q_len: int,
          k_len: int) -> ExactMask:
    """An :class:`ExactMask` from its tiles that are on, those of them that
    are partial (both bool ``[B or 1, H or 1, nbq, nbk]``), and
    ``tile_bits(b, h, qb, kb)``: the bool ``[n, block_q, block_k]`` element
    masks of the n partial tiles at those index tensors (positions past the
    lengths False)."""
    bq, bk = block_sizes(block_size)
    where = partial.nonzero(as_tuple=True)
    slots = where[0].numel()
    index = torch.full(partial.shape, -1, dtype=torch.int32, device=partial.device)
    index[where] = torch.arange(slots, dtype=torch.int32, device=partial.device)
    words = -(-bk // 32)
    bits = torch.zeros(slots, bq, words * 32, dtype=torch.bool, device=partial.device)
    if slots:
        bits[..., :bk] = tile_bits(*where)
    weights = torch.ones(32, dtype=torch.int64, device=partial.device).bitwise_left_shift(
        torch.arange(32, device=partial.device))
    packed = (bits.view(slots, bq, words, 32).long() * weights).sum(-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    causal = _is_tiles_and_causal(tiles.bool(), partial, where, bits[..., :bk], (bq, bk), q_len,
                                  k_len)
    return ExactMask(tiles.bool(), index, packed, (bq, bk), int(q_len), int(k_len), causal)


def _is_tiles_and_causal(tiles, partial, where, bits, block_size, q_len, k_len) -> bool:
    """Whether the mask is its tiles with top-left causal masking: every full
    tile wholly at or below the diagonal, every partial tile's bits the
    diagonal's. Such a mask runs as (tiles, is_causal) on the tensor cores."""
    bq, bk = block_size
    device = tiles.device
    nbq, nbk = tiles.shape[-2:]
    first_row = torch.arange(nbq, device=device)[:, None] * bq
    last_key = torch.clamp(torch.arange(nbk, device=device)[None, :] * bk + bk, max=k_len) - 1
    full_ok = not (tiles & ~partial & (last_key > first_row)).any()
    if not full_ok or where[0].numel() == 0:
        return full_ok
    rows = where[2][:, None] * bq + torch.arange(bq, device=device)
    keys = where[3][:, None] * bk + torch.arange(bk, device=device)
    inside = (rows < q_len)[:, :, None] & (keys < k_len)[:, None, :]
    diagonal = (keys[:, None, :] <= rows[:, :, None]) & inside
    return bool(torch.equal(bits, diagonal))


def from_flex(block_mask) -> ExactMask:
    """The exact mask of a FlexAttention ``BlockMask``, at its own
    ``BLOCK_SIZE``: its full blocks full, its partial blocks partial with the
    bits of its ``mask_mod``, evaluated on the partial blocks only."""
    bq, bk = block_mask.BLOCK_SIZE
    q_len, k_len = block_mask.seq_lengths
    nbq, nbk = num_blocks(q_len, k_len, (bq, bk))
    partial = _tiles_of(block_mask.kv_num_blocks, block_mask.kv_indices, nbq, nbk)
    full = torch.zeros_like(partial)
    if block_mask.full_kv_num_blocks is not None:
        full = _tiles_of(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, nbq, nbk)
    partial = partial & ~full
    mask_mod = block_mask.mask_mod
    device = partial.device

    # mask_mod takes scalar index tensors, as Flex calls it: vmapped over a
    # tile's keys, then its rows, then the tiles.
    per_tile = torch.vmap(torch.vmap(torch.vmap(mask_mod, in_dims=(None, None, None, 0)),
                                     in_dims=(None, None, 0, None)), in_dims=(0, 0, 0, 0))

    def tile_bits(b, h, qb, kb):
        rows = qb[:, None] * bq + torch.arange(bq, device=device)  # [n, bq]
        keys = kb[:, None] * bk + torch.arange(bk, device=device)  # [n, bk]
        inside = (rows < q_len)[:, :, None] & (keys < k_len)[:, None, :]
        bits = per_tile(b, h, rows.clamp(max=q_len - 1), keys.clamp(max=k_len - 1))
        return bits.bool() & inside

    return exact(partial | full, partial, tile_bits, (bq, bk), q_len, k_len)


def _tiles_of(num, indices, nbq, nbk):
    """Dense [B, H, nbq, nbk] from Flex's (count, index list) per query block.
    Entries past the count are unused slots and may hold any index: they add 0."""
    num = num[..., :nbq].long()
    idx = indices[..., :nbq, :].long().clamp(0, max(nbk - 1, 0))
    used = torch.arange(idx.shape[-1], device=idx.device) < num[..., None]
    hits = torch.zeros(idx.shape[:-1] + (nbk,), dtype=torch.int32, device=idx.device)
    hits.scatter_add_(-1, idx, used.int())
    return hits > 0


def to_dense(block_mask, q_len: int, k_len: int, block_size: BlockSize = 64, *,
             is_causal: bool = False) -> Tensor:
    """The element mask ``[B or 1, H or 1, q_len, k_len]`` that a block mask
    (4-D or flattened, or an :class:`ExactMask`, whose own block size counts)
    means -- what to hand SDPA's ``attn_mask`` to get the same result.
    Allocates ``q_len x k_len``: for tests and small problems."""
    if isinstance(block_mask, ExactMask):
        return _exact_to_dense(block_mask, is_causal)
    bq, bk = block_sizes(block_size)
    nbq, nbk = num_blocks(q_len, k_len, (bq, bk))
    m = block_mask.bool()
    if m.dim() == 3:
        m = m.reshape(m.shape[0], m.shape[1], nbq, nbk)
    dense = m.repeat_interleave(bq, dim=2)[:, :, :q_len].repeat_interleave(bk, dim=3)[..., :k_len]
    if is_causal:
        dense = dense & torch.ones(q_len, k_len, dtype=torch.bool, device=m.device).tril()
    return dense


def _exact_to_dense(mask: ExactMask, is_causal: bool) -> Tensor:
    bq, bk = mask.block_size
    dense = to_dense(mask.tiles, mask.q_len, mask.k_len, (bq, bk), is_causal=is_causal)
    B, H, nbq, nbk = mask.tiles.shape
    dense = dense.expand(B, H, -1, -1).clone()
    words = mask.partial_bits.shape[-1]
    shifts = torch.arange(32, device=mask.partial_bits.device)
    bits = ((mask.partial_bits[..., None] >> shifts) & 1).bool().reshape(-1, bq, words * 32)
    for b, h, qb, kb in (mask.partial_index >= 0).nonzero().tolist():
        slot = int(mask.partial_index[b, h, qb, kb])
        rows = slice(qb * bq, min((qb + 1) * bq, mask.q_len))
        keys = slice(kb * bk, min((kb + 1) * bk, mask.k_len))
        tile = bits[slot, :rows.stop - rows.start, :keys.stop - keys.start]
        dense[b, h, rows, keys] &= tile
    return dense
