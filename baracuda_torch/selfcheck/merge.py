"""Main-job rows of the attention-state merge family: float64 references,
timed against the eager torch formula."""

import math

import torch

import baracuda_torch as bt

from . import Check


def _reference(v, s):
    """float64 merge of states stacked on axis -3 (base-2 LSE)."""
    s64 = s.double() * math.log(2.0)
    m = s64.amax(dim=-2, keepdim=True)
    w = torch.exp(s64 - m)
    total = w.sum(-2, keepdim=True)
    out_v = (w.unsqueeze(-1) * v.double()).sum(-3) / total.unsqueeze(-1).squeeze(-3)
    return out_v, ((m + torch.log(total)) / math.log(2.0)).squeeze(-2)


def _eager(v, s):
    m = s.amax(dim=-2, keepdim=True)
    w = torch.exp2(s - m)
    total = w.sum(-2)
    return (v.float() * w[..., None]).sum(-3) / total[..., None], m.squeeze(-2) + torch.log2(total)


def _case(device, dtype, shape, n, op):
    g = torch.Generator(device=device).manual_seed(0)
    stack_shape = shape[:-2] + (n,) + shape[-2:]
    v = torch.randn(stack_shape, generator=g, device=device).to(dtype)
    s_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    s = (torch.randn(stack_shape[:-1], generator=g, device=device) * 4).to(s_dtype)
    if op == "merge_state":
        ours = lambda: bt.merge_state(v[..., 0, :, :], s[..., 0, :], v[..., 1, :, :], s[..., 1, :])[0]  # noqa: E731
    else:
        ours = lambda: bt.merge_states(v, s)[0]  # noqa: E731
    tol = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]
    return Check(op, dtype, "x".join(map(str, stack_shape)), ours, lambda: _reference(v, s)[0],
                 lambda: _eager(v, s), tolerance=tol * 4)


def checks(device):
    seq = 4096 if device.type == "cuda" else 256
    return [
        _case(device, torch.bfloat16, (seq, 32, 128), 2, "merge_state"),
        _case(device, torch.float32, (seq, 32, 128), 2, "merge_state"),
        _case(device, torch.float64, (64, 8, 7), 2, "merge_state"),
        _case(device, torch.bfloat16, (seq // 4, 32, 128), 8, "merge_states"),
    ]
