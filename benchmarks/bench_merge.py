"""Attention-state merge benchmark cases.

Peers: the merge formula in eager torch, and the same formula through
torch.compile (what a user writes today: FlashInfer's merge is inference-only
and takes base-2 LSE). Bytes moved: every state read once, the merged state
written once (the LSE arrays are counted too).
"""

import torch

import baracuda_torch as bt
from common import Case, dtype_name, n_sets, rotate


def formula(va, sa, vb, sb):
    m = torch.maximum(sa, sb)
    wa, wb = torch.exp2(sa - m), torch.exp2(sb - m)
    total = wa + wb
    v = (va.float() * wa[..., None] + vb.float() * wb[..., None]) / total[..., None]
    return v.to(va.dtype), m + torch.log2(total)


def formula_many(v, s):
    m = s.amax(dim=-2, keepdim=True)
    w = torch.exp2(s - m)
    total = w.sum(-2)
    out = (v.float() * w[..., None]).sum(-3) / total[..., None]
    return out.to(v.dtype), m.squeeze(-2) + torch.log2(total)


_compiled = {}


def compiled(fn):
    if fn not in _compiled:
        _compiled[fn] = torch.compile(fn, dynamic=False)
    return _compiled[fn]


def _states(shape, dtype, device, count):
    out = []
    for _ in range(count):
        v = torch.randn(shape, device=device).to(dtype)
        s = torch.randn(shape[:-1], device=device) * 4
        out.append((v, s))
    return out


def _pair_cases(device, shape, dtype, label, graph_rows):
    esize = torch.empty((), dtype=dtype).element_size()
    cells = torch.Size(shape[:-1]).numel()
    state_bytes = cells * shape[-1] * esize + cells * 4
    states = _states(shape, dtype, device, 2 * n_sets(3 * state_bytes))
    sets = list(zip(states[0::2], states[1::2]))  # (state a, state b) per set
    ours = rotate([lambda a=a, b=b: bt.merge_state(*a, *b) for a, b in sets])
    eager = rotate([lambda a=a, b=b: formula(*a, *b) for a, b in sets])
    comp = rotate([lambda a=a, b=b: compiled(formula)(*a, *b) for a, b in sets])
    common = dict(dtype=dtype_name(dtype), bytes_moved=3 * state_bytes)
    inplace_sets = [((a[0].clone(), a[1].clone()), b) for a, b in sets]
    in_place = rotate([lambda a=a, b=b: bt.merge_state_(*a, *b) for a, b in inplace_sets])
    cases = [
        Case(f"merge_state {label}", ours=ours, peer=eager, peer_name="eager formula", **common),
        Case(f"merge_state {label}", ours=ours, peer=comp, peer_name="torch.compile formula", **common),
        Case(f"merge_state_ (in place) {label}", ours=in_place, peer=ours,
             peer_name="ours, out of place", **common),
    ]
    if cells <= 1024:
        # Host-bound: the floor is what one small torch kernel costs per call.
        floor = rotate([lambda a=a, b=b: torch.add(a[0], b[0]) for a, b in sets])
        cases.append(Case(f"merge_state {label}", ours=ours, peer=floor,
                          peer_name="floor: one torch.add launch", **common))
    if graph_rows:
        cases.append(Case(f"merge_state {label}, CUDA graph", ours=ours, peer=comp,
                          peer_name="torch.compile formula", graph=True, **common))
    return cases


def _backward_cases(device, shape, dtype, label):
    """Fused backward kernel alone, and forward + backward against the
    compiled formula's forward + backward."""
    esize = torch.empty((), dtype=dtype).element_size()
    cells = torch.Size(shape[:-1]).numel()
    state_bytes = cells * shape[-1] * esize + cells * 4
    a, b = _states(shape, dtype, device, 2)
    leaves = [t.clone().requires_grad_() for t in (*a, *b)]
    gv = torch.randn(shape, device=device).to(dtype)
    gs = torch.randn(shape[:-1], device=device)
    back = lambda: torch.ops.baracuda.merge_state_backward(gv, gs, *a, *b, "2")  # noqa: E731

    def ours_fwd_bwd():
        v, s = bt.merge_state(*leaves)
        torch.autograd.grad((v, s), leaves, (gv, gs))

    def peer_fwd_bwd():
        v, s = compiled(formula)(*leaves)
        torch.autograd.grad((v, s), leaves, (gv, gs))

    return [
        Case(f"merge_state backward (fused) {label}", dtype=dtype_name(dtype),
             bytes_moved=5 * state_bytes, ours=back),
        Case(f"merge_state fwd+bwd {label}", dtype=dtype_name(dtype), bytes_moved=8 * state_bytes,
             ours=ours_fwd_bwd, peer=peer_fwd_bwd, peer_name="torch.compile fwd+bwd"),
    ]


def _many_cases(device, shape, dtype, label):
    esize = torch.empty((), dtype=dtype).element_size()
    n = shape[-3]
    out_cells = torch.Size(shape[:-3] + shape[-2:-1]).numel()
    bytes_moved = (n + 1) * out_cells * (shape[-1] * esize + 4)
    sets = _states(shape, dtype, device, n_sets(bytes_moved))
    common = dict(dtype=dtype_name(dtype), bytes_moved=bytes_moved)
    ours = rotate([lambda v=v, s=s: bt.merge_states(v, s) for v, s in sets])
    return [
        Case(f"merge_states {label}", ours=ours,
             peer=rotate([lambda v=v, s=s: formula_many(v, s) for v, s in sets]),
             peer_name="eager formula", **common),
        Case(f"merge_states {label}", ours=ours,
             peer=rotate([lambda v=v, s=s: compiled(formula_many)(v, s) for v, s in sets]),
             peer_name="torch.compile formula", **common),
    ]


def cases(device, quick=False):
    bf16 = torch.bfloat16
    seq, many = (256, 64) if quick else (8192, 4096)
    graphs = device.type == "cuda"
    out = []
    out += _pair_cases(device, (seq, 32, 128), bf16, f"[{seq}, 32, 128]", graph_rows=False)
    out += _pair_cases(device, (1, 32, 128), bf16, "decode [1, 32, 128]", graph_rows=graphs)
    out += _pair_cases(device, (seq, 32, 128), torch.float32, f"[{seq}, 32, 128]", graph_rows=False)[:1]
    out += _many_cases(device, (many, 8, 32, 128), bf16, f"[{many}, 8, 32, 128]")
    out += _backward_cases(device, (seq, 32, 128), bf16, f"[{seq}, 32, 128]")
    return out
