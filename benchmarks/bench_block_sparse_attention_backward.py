"""Block-sparse attention backward benchmark cases (bf16, B=4, H=16, L=8192).

The patterns and peers of ``bench_block_sparse_attention`` (all blocks,
causal, sliding window 1024 + one sink block, random 10 %; block 128 and 64;
D 128 and 64), timed as a user trains: ``torch.autograd.grad`` of q, k and v
for one output gradient, the forward run once outside the timed region (its
graph retained). Peers on the same mask: FlexAttention
(``torch.compile(flex_attention)`` with the equivalent ``BlockMask``) and
dense SDPA's backward (flash backend, and torch's default pick, cuDNN's on
Hopper). TFLOP/s count 2.5 times the forward's FLOPs of the tiles that are
on (the five matrix products of a backward against the forward's two). One
more row times a whole training step (forward + backward) of a
sliding-window layer, ours against Flex.
"""

import torch

import baracuda_torch as bt
from bench_block_sparse_attention import dense_sdpa, flex, flex_block_mask, patterns
from common import Case

BACKWARD_FLOPS = 2.5  # a backward's matrix FLOPs over its forward's


def grad_of(forward, q, k, v, grad_out):
    """A callable that runs the backward of one retained forward graph."""
    out = forward()
    return lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)


def training_step(forward, q, k, v, grad_out):
    return lambda: torch.autograd.grad(forward(), (q, k, v), grad_out)


def cases(device, quick=False):
    B, H, L = (1, 2, 512) if quick else (4, 16, 8192)
    dtype = torch.bfloat16
    on_cuda = device.type == "cuda"
    out = []
    for D in (128, 64):
        q, k, v = (torch.randn(B, H, L, D, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        grad_out = torch.randn(B, H, L, D, device=device, dtype=dtype)
        for bs in (128, 64):
            for label, m, causal in patterns(L, bs, B, H, device):
                m = m.to(device)
                flops = BACKWARD_FLOPS * bt.attention_flops(q, k, v, m, bs, is_causal=causal)
                name = f"backward {label} blk{bs} [{B}, {H}, {L}, {D}]"
                ours = grad_of(lambda m=m, bs=bs, c=causal: bt.block_sparse_attention(
                    q, k, v, m, block_size=bs, is_causal=c), q, k, v, grad_out)
                if on_cuda:
                    bm = flex_block_mask(m.expand(B, H, -1, -1).contiguous(), L, bs, causal)
                    opts = {"BLOCK_M": bs, "BLOCK_N": bs} if bs < 128 else None
                    peer = grad_of(lambda bm=bm, o=opts: flex()(q, k, v, block_mask=bm,
                                                                kernel_options=o),
                                   q, k, v, grad_out)
                    out.append(Case(name, dtype="bfloat16", bytes_moved=0, flops=flops, ours=ours,
                                    peer=peer, peer_name="FlexAttention (compiled)", reps=10))
                for flash_only in (True, False):
                    peer = grad_of(lambda c=causal, f=flash_only: dense_sdpa(q, k, v, c, f),
                                   q, k, v, grad_out)
                    peer_name = ("dense SDPA" + (" causal" if causal else "")
                                 + (", flash backend" if flash_only else ", default backend"))
                    out.append(Case(name, dtype="bfloat16", bytes_moved=0, flops=flops, ours=ours,
                                    peer=peer, peer_name=peer_name, reps=10))
                if quick:
                    break
            if quick:
                break
        if quick:
            break
    # A training step of one sliding-window layer (D 128, block 128): forward
    # and backward, as torch.autograd.grad of the output.
    D, bs = 128, 128
    q, k, v = (torch.randn(B, H, L, D, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    grad_out = torch.randn(B, H, L, D, device=device, dtype=dtype)
    label, m, causal = patterns(L, bs, B, H, device)[2]
    m = m.to(device)
    flops = (1 + BACKWARD_FLOPS) * bt.attention_flops(q, k, v, m, bs, is_causal=causal)
    name = f"training step (forward + backward) {label} blk{bs} [{B}, {H}, {L}, {D}]"
    ours = training_step(lambda: bt.block_sparse_attention(q, k, v, m, block_size=bs,
                                                           is_causal=causal), q, k, v, grad_out)
    if on_cuda:
        bm = flex_block_mask(m.expand(B, H, -1, -1).contiguous(), L, bs, causal)
        peer = training_step(lambda: flex()(q, k, v, block_mask=bm), q, k, v, grad_out)
        out.append(Case(name, dtype="bfloat16", bytes_moved=0, flops=flops, ours=ours, peer=peer,
                        peer_name="FlexAttention (compiled)", reps=10))
    else:
        out.append(Case(name, dtype="bfloat16", bytes_moved=0, flops=flops, ours=ours, reps=10))
    return out
