"""Block-sparse attention with masks exact to the element, against
FlexAttention with the same ``mask_mod`` (bf16, B=4, H=16, L=8192, D=128).

Patterns:
- sliding window of 1024 with exact edges plus 128 sink keys, causal: ours
  takes ``masks.from_flex`` of Flex's own ``BlockMask``;
- causal packed documents (random lengths, 8 to 64 documents per batch
  row): ours takes ``document_ids`` and ``is_causal``;
- prefix-LM (the first 1024 keys visible to every query, causal after):
  ``masks.from_flex`` as for the window.

Each pattern has a forward row (``torch.no_grad``) and a backward row
(``torch.autograd.grad`` of q, k, v, the forward run once outside the
timing), ours against ``torch.compile(flex_attention)``; TFLOP/s count the
(query, key) pairs the mask keeps. The note of each
pattern gives the time of Flex's ``create_block_mask`` next to ours (the
``masks.from_flex`` conversion of that BlockMask; nothing for the ids), and
the first-call latency of each (Flex compiles).
"""

import time

import torch

import baracuda_torch as bt
from baracuda_torch import masks
from bench_block_sparse_attention import first_call_ms, flex
from bench_block_sparse_attention_backward import BACKWARD_FLOPS, grad_of
from common import Case

BLOCK = 128
PREFIX = 1024
SINK = 128
WINDOW = 1024


def _documents(B, L, device, generator):
    """[B, L] int64 ids of 8 to 64 packed documents of random lengths per row."""
    ids = torch.empty(B, L, dtype=torch.int64)
    for b in range(B):
        n = int(torch.randint(8, 65, (), generator=generator))
        cuts = torch.randperm(L - 1, generator=generator)[:n - 1].sort().values + 1
        ids[b] = torch.bucketize(torch.arange(L), cuts, right=True)
    return ids.to(device)


def _visible_pairs(mask_mod, B, flex_batch, L, device) -> float:
    """(query, key) pairs the mask keeps, summed over the batch."""
    i = torch.arange(L, device=device)[:, None]
    j = torch.arange(L, device=device)[None, :]
    rows = range(B) if flex_batch is not None else range(1)
    pairs = sum(float(mask_mod(torch.tensor(b, device=device), 0, i, j).sum()) for b in rows)
    return pairs if flex_batch is not None else pairs * B


def _timed_ms(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    value = fn()
    torch.cuda.synchronize()
    return value, (time.perf_counter() - t0) * 1e3


def _patterns(B, L, device):
    """(label, mask_mod, Flex batch size, our keyword arguments from the
    BlockMask or None)."""
    g = torch.Generator().manual_seed(0)
    docs = _documents(B, L, device, g)

    def window_sink(b, h, q, kv):
        return (q >= kv) & ((q - kv < WINDOW) | (kv < SINK))

    def packed(b, h, q, kv):
        return (docs[b, q] == docs[b, kv]) & (q >= kv)

    def prefix_lm(b, h, q, kv):
        return (kv < PREFIX) | (q >= kv)

    from_flex = lambda bm: dict(block_mask=masks.from_flex(bm))  # noqa: E731
    by_ids = lambda bm: dict(is_causal=True, document_ids=(docs, docs))  # noqa: E731
    return [
        (f"sliding window {WINDOW} exact + {SINK} sink keys", window_sink, None, from_flex),
        ("causal packed documents (8-64 per row)", packed, B, by_ids),
        (f"prefix-LM (prefix {PREFIX})", prefix_lm, None, from_flex),
    ]


def cases(device, quick=False):
    if device.type != "cuda":
        return []  # FlexAttention's compiled kernels need a GPU
    from torch.nn.attention.flex_attention import create_block_mask

    B, H, L, D = (1, 2, 1024, 128) if quick else (4, 16, 8192, 128)
    dtype = torch.bfloat16
    q, k, v = (torch.randn(B, H, L, D, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    grad_out = torch.randn(B, H, L, D, device=device, dtype=dtype)
    out = []
    for label, mask_mod, flex_batch, ours_kwargs in _patterns(B, L, device):
        bm, flex_build_ms = _timed_ms(lambda: create_block_mask(
            mask_mod, flex_batch, None, L, L, device=device.type, BLOCK_SIZE=BLOCK))
        kwargs, our_build_ms = _timed_ms(lambda: ours_kwargs(bm))
        flops = 2.0 * (D + D) * H * _visible_pairs(mask_mod, B, flex_batch, L, device)

        def ours_forward(kwargs=kwargs):
            return bt.block_sparse_attention(q, k, v, **kwargs)

        def flex_forward(bm=bm):
            return flex()(q, k, v, block_mask=bm)

        with torch.no_grad():
            our_first = first_call_ms(ours_forward)
            flex_first = first_call_ms(flex_forward)
        built = (f"masks.from_flex of it {our_build_ms:.1f} ms" if "block_mask" in kwargs
                 else "ours reads the ids as they are")
        note = (f"{label}: Flex create_block_mask {flex_build_ms:.1f} ms, {built}; first call "
                f"{our_first:.1f} ms (ours) / {flex_first:.0f} ms (Flex)")

        def no_grad(fn):
            def call():
                with torch.no_grad():
                    return fn()
            return call

        out.append(Case(f"forward {label} [{B}, {H}, {L}, {D}]", dtype="bfloat16", bytes_moved=0,
                        flops=flops, ours=no_grad(ours_forward), peer=no_grad(flex_forward),
                        peer_name="FlexAttention (compiled)", note=note, reps=10))
        out.append(Case(f"backward {label} [{B}, {H}, {L}, {D}]", dtype="bfloat16",
                        bytes_moved=0, flops=BACKWARD_FLOPS * flops,
                        ours=grad_of(ours_forward, q, k, v, grad_out),
                        peer=grad_of(flex_forward, q, k, v, grad_out),
                        peer_name="FlexAttention (compiled)", reps=10))
    return out
