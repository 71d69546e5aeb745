"""Block-sparse scaled-dot-product attention (forward).

Attention in which the score matrix is cut into ``block_q x block_k`` tiles
and a boolean *block mask* says which tiles exist; the tiles that are off
cost nothing (their keys and values are never read)::

    out[b, h, i] = sum_j softmax_j(scale * q[b, h, i] . k[b, g, j]) v[b, g, j]

over the keys ``j`` whose block ``j // block_k`` is on in row ``i // block_q``
of ``block_mask[b, h]`` (and ``j <= i`` with ``is_causal``), where
``g = h // (H // Hkv)`` (grouped-query attention). Builders for the usual
patterns (causal, sliding window with sinks, BigBird, dilated, random, from a
dense mask or a FlexAttention ``BlockMask``) live in :mod:`baracuda_torch.masks`.

================  ===========================================================
tensor            shape
================  ===========================================================
q                 ``[B, H, Lq, D]``
k                 ``[B, Hkv, Lk, D]``, ``H % Hkv == 0``
v                 ``[B, Hkv, Lk, Dv]``
block_mask        ``[B or 1, H or 1, ceil(Lq / block_q), ceil(Lk / block_k)]``
                  bool or uint8 (or the last two axes flattened into one)
out               ``[B, H, Lq, Dv]``, q's dtype
lse               ``[B, H, Lq]``, natural log; float32 (float64 for float64 q)
================  ===========================================================

Dtypes: float16 / bfloat16 (tensor cores on CUDA, float32 accumulation),
float32 and float64. Head dims up to 256; any strides. A query row that sees
no key gets ``out = 0`` and ``lse = -inf`` -- the empty attention state, so
results combine with :func:`baracuda_torch.merge_state` (``lse_base="e"``) --
and zero gradients. A NaN in q, k or v reaches the outputs and gradients of
every row that sees it, as with SDPA.

Differentiable with respect to ``q``, ``k`` and ``v``, through ``out`` and
through ``lse`` (so split-KV or context-parallel attention merged with
``merge_state`` trains): one backward op,
``torch.ops.baracuda.block_sparse_attention_backward``, deterministic (the
same bits on every run, also under ``torch.use_deterministic_algorithms``).
Double backward is not supported.
"""

import math
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

_OPS = torch.ops.baracuda

BlockSize = Union[int, Tuple[int, int]]


def block_sizes(block_size: BlockSize) -> Tuple[int, int]:
    """``(block_q, block_k)`` from an int or a pair; both must be positive."""
    if isinstance(block_size, int):
        pair = (block_size, block_size)
    else:
        pair = tuple(int(b) for b in block_size)
    if len(pair) != 2 or min(pair) <= 0:
        raise ValueError(f"block_size={block_size!r} must be a positive int or a pair (block_q, block_k)")
    return pair


class ExactMask(NamedTuple):
    """A mask exact to the element, as :func:`masks.from_dense` and
    :func:`masks.from_flex` build it: each tile is off (skipped), full (no
    per-element work) or partial (a bit per element, read only there).
    Passed as ``block_mask``, it gives exactly the dense element mask's
    result."""

    tiles: Tensor  # bool [B or 1, H or 1, nbq, nbk]: the tiles that are on, full or partial
    partial_index: Tensor  # int32, shaped as tiles: -1, or the tile's slot in partial_bits
    partial_bits: Tensor  # int32 [slots, block_q, ceil(block_k / 32)]: bit c % 32 of word c // 32
    block_size: Tuple[int, int]  # (block_q, block_k) it was built for
    q_len: int
    k_len: int
    # The mask is its tiles with top-left causal masking (a causal Flex mask,
    # say): it then runs as (tiles, is_causal), on the tensor cores.
    causal: bool = False


def _mask_arguments(q: Tensor, k: Tensor, block_mask, block_size, document_ids=None,
                    causal_align: str = "top_left") -> tuple:
    """(tiles, block_q, block_k, partial_index, partial_bits, causal) for the
    ops; causal: the mask is (tiles, top-left causal). An exact mask without
    partial tiles, or one that is its tiles made causal, needs no bits. With
    document ids, a tile mask (or None) also loses the tiles whose rows and
    keys share no document (masks.document_tiles): they are skipped."""
    if isinstance(block_mask, ExactMask):
        bq, bk = block_mask.block_size
        if block_size is not None and block_sizes(block_size) != (bq, bk):
            raise ValueError(f"block_sparse_attention: block_size={block_size!r} differs from the "
                             f"exact mask's {(bq, bk)}; leave it out")
        if q.shape[2] != block_mask.q_len or k.shape[2] != block_mask.k_len:
            raise ValueError(f"block_sparse_attention: the exact mask was built for q_len="
                             f"{block_mask.q_len}, k_len={block_mask.k_len}; got q_len="
                             f"{q.shape[2]}, k_len={k.shape[2]}")
        top_left = causal_align == "top_left" or q.shape[2] == k.shape[2]
        if block_mask.partial_bits.shape[0] == 0:
            return block_mask.tiles, bq, bk, None, None, False
        if block_mask.causal and top_left:
            return block_mask.tiles, bq, bk, None, None, True
        return block_mask.tiles, bq, bk, block_mask.partial_index, block_mask.partial_bits, False
    bq, bk = block_sizes(64 if block_size is None else block_size)
    tiles = _all_blocks(q, k, bq, bk) if block_mask is None else block_mask
    if _well_formed(q, k, tiles, bq, bk, document_ids):
        from .masks import document_tiles  # masks imports this module

        nbq, nbk = -(-q.shape[2] // bq), -(-k.shape[2] // bk)
        tiles = document_tiles(*document_ids, (bq, bk)) & tiles.bool().reshape(
            tiles.shape[0], tiles.shape[1], nbq, nbk)
    return tiles, bq, bk, None, None, False


def _well_formed(q: Tensor, k: Tensor, tiles: Tensor, bq: int, bk: int, document_ids) -> bool:
    """Whether there are document ids, and they and the tile mask have the
    shapes the op accepts (if not, the op's own checks name the problem)."""
    if not isinstance(document_ids, (tuple, list)) or len(document_ids) != 2:
        return False
    q_ids, kv_ids = document_ids
    if not (isinstance(q_ids, Tensor) and isinstance(kv_ids, Tensor)):
        return False
    B, H, Lq, Lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    ids_ok = all(t.dim() == 2 and t.shape[0] in (1, B) and t.shape[1] == n and
                 not t.is_floating_point() and t.device == q.device
                 for t, n in ((q_ids, Lq), (kv_ids, Lk)))
    nbq, nbk = -(-Lq // bq), -(-Lk // bk)
    tiles_ok = (tiles.dim() in (3, 4) and tiles.shape[0] in (1, B) and tiles.shape[1] in (1, H)
                and tiles.shape[2:].numel() == nbq * nbk and tiles.device == q.device)
    return ids_ok and tiles_ok


# Every-tile masks by (device, nbq, nbk): making one takes a fill and a view,
# about half the wrapper's cost per call. The byte is never written.
_ALL_BLOCKS = {}
_ALL_BLOCKS_KEPT = 64


def _new_all_blocks(device, nbq: int, nbk: int) -> Tensor:
    return torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device).expand(1, 1, nbq, nbk)


def _all_blocks(q: Tensor, k: Tensor, bq: int, bk: int) -> Tensor:
    """A mask with every tile on, broadcast over batch and heads (one byte
    stored)."""
    nbq, nbk = -(-q.shape[2] // bq), -(-k.shape[2] // bk)
    key = (q.device, nbq, nbk)
    mask = None if torch.compiler.is_compiling() else _ALL_BLOCKS.get(key)
    if mask is not None:
        return mask
    # Not kept: symbolic sizes in a compiled graph, or a fill captured into
    # a CUDA graph (it runs only on replay, in the graph's memory).
    if torch.compiler.is_compiling() or (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        return _new_all_blocks(q.device, nbq, nbk)
    if len(_ALL_BLOCKS) >= _ALL_BLOCKS_KEPT:
        _ALL_BLOCKS.clear()
    with torch.inference_mode(False):  # the backward saves it: no inference tensor
        mask = _new_all_blocks(q.device, nbq, nbk)
    _ALL_BLOCKS[key] = mask
    return mask


def _element_arguments(causal_align: str, window, document_ids) -> tuple:
    """The ops' trailing element arguments from the public ones."""
    if window is None:
        left = right = None
    else:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise ValueError(f"block_sparse_attention: window={window!r} must be a pair "
                             "(left, right), None on a side for no limit")
        left, right = window
    if document_ids is None:
        q_ids = kv_ids = None
    else:
        if not isinstance(document_ids, (tuple, list)) or len(document_ids) != 2:
            raise ValueError("block_sparse_attention: document_ids must be a pair (q_ids, kv_ids) "
                             f"of tensors, got {type(document_ids).__name__}")
        q_ids, kv_ids = document_ids
    return causal_align, left, right, q_ids, kv_ids


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, block_mask=None, *,
                           block_size: Optional[BlockSize] = None, scale: float = None,
                           is_causal: bool = False, causal_align: str = "top_left",
                           window=None, document_ids=None, kv_lens: Optional[Tensor] = None,
                           return_lse: bool = False):
    """Attention over the keys that the block mask and the element conditions
    keep; all conditions AND together.

    Args:
        q, k, v: ``[B, H, Lq, D]``, ``[B, Hkv, Lk, D]``, ``[B, Hkv, Lk, Dv]``.
        block_mask: bool/uint8 ``[B or 1, H or 1, nbq, nbk]`` with
            ``nbq = ceil(Lq / block_q)``, ``nbk = ceil(Lk / block_k)``; size-1
            axes broadcast. ``[B or 1, H or 1, nbq * nbk]`` is accepted too.
            Such tiles are whole: a tile that is on computes every key the
            element conditions keep. An :class:`ExactMask`
            (``masks.from_dense``, ``masks.from_flex``) is exact to the
            element. ``None``: every tile on.
        block_size: ``block_q = block_k`` (int) or ``(block_q, block_k)``;
            default 64, an exact mask's own with one (give no other). Any
            positive sizes are correct; multiples of 64 take the tensor-core
            path on CUDA for float16/bfloat16 with ``D = Dv`` in {64, 128},
            forward and backward (without document ids, which run the
            generic kernels).
        scale: score scale, default ``1 / sqrt(D)``.
        is_causal: hide keys after the query's position; key blocks past it
            are skipped.
        causal_align: where query ``i`` sits among the keys: ``"top_left"``
            (PyTorch's ``is_causal``: at key ``i``) or ``"bottom_right"``
            (FlashAttention's: at ``i + Lk - Lq``, a chunk of new queries
            after a KV cache). Positions serve ``is_causal`` and ``window``.
        window: ``(left, right)``: key ``j`` is visible to the query at
            position ``p`` only when ``p - left <= j <= p + right``; ``None``
            on a side for no limit. Key blocks outside it are skipped.
        document_ids: ``(q_ids, kv_ids)``, int32/int64 ``[B or 1, Lq]`` and
            ``[B or 1, Lk]`` on q's device: a key is visible only where its
            id equals the query's (packed variable-length sequences). Read on
            the device; no host sync.
        kv_lens: int32/int64 ``[B]`` on q's device: batch row ``b`` attends
            keys ``[0, kv_lens[b])`` of a preallocated cache (``k``, ``v`` of
            length ``S_max``), never reading past them; with
            ``causal_align="bottom_right"`` the queries sit at the end of
            each row's keys. Read on the device (a decode loop captures in
            one CUDA graph); lengths outside ``[0, S_max]`` raise on CPU and
            are clamped to it on CUDA (a check would cost a host sync).
        return_lse: also return the log-sum-exp of the scores.

    Returns:
        ``out`` or ``(out, lse)``. A row with no visible key: ``out = 0``,
        ``lse = -inf``, zero gradients.

    Example::

        >>> from baracuda_torch import masks
        >>> q = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
        >>> k, v = torch.randn_like(q), torch.randn_like(q)
        >>> m = masks.sliding_window(4096, 4096, window=1024, block_size=128, sink_blocks=1)
        >>> out = block_sparse_attention(q, k, v, m.cuda(), block_size=128, is_causal=True)
    """
    tiles, bq, bk, index, bits, causal = _mask_arguments(q, k, block_mask, block_size,
                                                         document_ids, causal_align)
    out, lse = _OPS.block_sparse_attention.default(
        q, k, v, tiles, bq, bk, scale, is_causal or causal,
        *_element_arguments(causal_align, window, document_ids), index, bits, kv_lens)
    return (out, lse) if return_lse else out


def block_sparse_attention_path(q: Tensor, k: Tensor, v: Tensor, block_mask=None, *,
                                block_size: Optional[BlockSize] = None, scale: float = None,
                                is_causal: bool = False, causal_align: str = "top_left",
                                window=None, document_ids=None,
                                kv_lens: Optional[Tensor] = None) -> str:
    """Which executor :func:`block_sparse_attention` runs these arguments on:
    ``"cpu"``, ``"cuda_generic"``, ``"cuda_wgmma"`` (Hopper tensor cores) or
    ``"cuda_tensor_core"`` (mma.sync, other tensor-core GPUs)."""
    tiles, bq, bk, index, bits, causal = _mask_arguments(q, k, block_mask, block_size,
                                                         document_ids, causal_align)
    return _OPS.block_sparse_attention_path.default(
        q, k, v, tiles, bq, bk, scale, is_causal or causal,
        *_element_arguments(causal_align, window, document_ids), index, bits, kv_lens)


def attention_flops(q: Tensor, k: Tensor, v: Tensor, block_mask,
                    block_size: Optional[BlockSize] = None, is_causal: bool = False) -> float:
    """Matmul FLOPs of the (query, key) pairs the call computes: ``2 (D + Dv)``
    per visible pair (QK^T and PV), summed over the tiles that are on -- the
    work done, for TFLOP/s figures."""
    block_mask, bq, bk, _, _, causal = _mask_arguments(q, k, block_mask, block_size)
    is_causal = is_causal or causal
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    nbq, nbk = math.ceil(Lq / bq), math.ceil(Lk / bk)
    m = block_mask.reshape(block_mask.shape[0], block_mask.shape[1], nbq, nbk)
    tiles = m.expand(B, H, nbq, nbk).sum(dim=(0, 1)).double().cpu()  # heads x batch on per tile
    rows = torch.arange(Lq, dtype=torch.float64)[:, None]
    first = torch.arange(nbk, dtype=torch.float64)[None, :] * bk
    width = torch.clamp(first + bk, max=Lk) - first
    visible = torch.clamp(rows - first + 1, min=0).minimum(width) if is_causal else width.expand(Lq, nbk)
    pairs = (tiles[torch.arange(Lq) // bq] * visible).sum()
    return 2.0 * float(pairs) * (D + v.shape[-1])


# ---------------------------------------------------------------- fake kernels


# These are also the ops' Meta kernels, and a call with one meta tensor among
# tensors of another device dispatches to Meta: the device check of the real
# kernels is repeated here, or such a call would return uninitialised tensors.


def _check_devices(op: str, q: Tensor, **others) -> None:
    for name, t in others.items():
        if t is not None and t.device != q.device:
            raise RuntimeError(f"baracuda::{op}: {name} is on {t.device} but q is on {q.device}")


@torch.library.register_fake("baracuda::block_sparse_attention")
def _block_sparse_attention_fake(q, k, v, block_mask, block_q, block_k, scale=None, is_causal=False,
                                 causal_align="top_left", window_left=None, window_right=None,
                                 q_document_ids=None, kv_document_ids=None, partial_index=None,
                                 partial_bits=None, kv_lens=None):
    _check_devices("block_sparse_attention", q, k=k, v=v, block_mask=block_mask,
                   q_document_ids=q_document_ids, kv_document_ids=kv_document_ids,
                   partial_index=partial_index, partial_bits=partial_bits, kv_lens=kv_lens)
    B, H, Lq, _ = q.shape
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty((B, H, Lq, v.shape[-1])), q.new_empty((B, H, Lq), dtype=lse_dtype)


@torch.library.register_fake("baracuda::block_sparse_attention_backward")
def _block_sparse_attention_backward_fake(grad_out, grad_lse, q, k, v, out, lse, block_mask,
                                          block_q, block_k, scale=None, is_causal=False,
                                          causal_align="top_left", window_left=None,
                                          window_right=None, q_document_ids=None,
                                          kv_document_ids=None, partial_index=None,
                                          partial_bits=None, kv_lens=None):
    _check_devices("block_sparse_attention_backward", q, k=k, v=v, out=out, lse=lse,
                   block_mask=block_mask, grad_out=grad_out, grad_lse=grad_lse,
                   q_document_ids=q_document_ids, kv_document_ids=kv_document_ids,
                   partial_index=partial_index, partial_bits=partial_bits, kv_lens=kv_lens)
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device))
