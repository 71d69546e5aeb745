"""linear_scan benchmark cases: h_t = a_t h_{t-1} + b_t along dim 1 of the
shapes of state-space layers ([batch, sequence, channels]).

Peer: ``torch.compile`` of ``torch._higher_order_ops.associative_scan`` with
the same combine, ``(a1, b1), (a2, b2) -> (a1 a2, a2 b1 + b2)``, the way
PyTorch offers this recurrence. Backward rows time ours as a user runs it,
``torch.autograd.grad`` of h with respect to (a, b) on a retained graph; the
peer is the same gradient written out and compiled (a reverse associative
scan of dh with a one step later, then da = g h_prev): with torch 2.11 on the
H200, autograd through the compiled associative scan did not finish
compiling within 90 s at these shapes. Timed on the device alone. Bytes
moved are the minimum: forward reads a, b and writes h; backward reads dh, a
and h and writes da and db.
"""

import torch

import baracuda_torch as bt
from common import Case, dtype_name, n_sets, rotate

SHAPES = [(8, 4096, 2048), (16, 2048, 4096)]
QUICK_SHAPES = [(2, 256, 128)]


def _combine(x, y):
    a1, b1 = x
    a2, b2 = y
    return a1 * a2, a2 * b1 + b2


def _associative_linear_scan(a, b, dim):
    from torch._higher_order_ops.associative_scan import associative_scan

    return associative_scan(_combine, (a, b), dim, combine_mode="pointwise")[1]


def _associative_backward(a, h, dh, dim):
    """(da, db) of the recurrence through two associative scans' worth of
    work: g = the reverse recurrence of dh with a one step later."""
    from torch._higher_order_ops.associative_scan import associative_scan

    a_next = torch.cat([a.narrow(dim, 1, a.shape[dim] - 1),
                        torch.zeros_like(a.narrow(dim, 0, 1))], dim)
    g = associative_scan(_combine, (a_next, dh), dim, reverse=True, combine_mode="pointwise")[1]
    h_prev = torch.cat([torch.zeros_like(h.narrow(dim, 0, 1)),
                        h.narrow(dim, 0, h.shape[dim] - 1)], dim)
    return g * h_prev, g


_compiled = {}


def _peer(name, fn):
    if name not in _compiled:
        _compiled[name] = torch.compile(fn, dynamic=False)
    return _compiled[name]


def _inputs(shape, dtype, device, count):
    out = []
    for _ in range(count):
        a = torch.rand(shape, device=device).mul_(0.2).add_(0.79).to(dtype)
        b = torch.randn(shape, device=device).to(dtype)
        dh = torch.randn(shape, device=device).to(dtype)
        out.append((a, b, dh))
    return out


def _backward_peer(sets, dim):
    forward = _peer("forward", _associative_linear_scan)
    backward = _peer("backward", _associative_backward)
    fns = []
    for a, b, dh in sets:
        h = forward(a, b, dim)
        fns.append(lambda a=a, h=h, dh=dh: backward(a, h, dh, dim))
    return fns


def cases(device, quick=False):
    dim = 1
    out = []
    for shape in QUICK_SHAPES if quick else SHAPES:
        numel = torch.Size(shape).numel()
        for dtype in (torch.float32, torch.bfloat16):
            esize = torch.empty((), dtype=dtype).element_size()
            label = f"{list(shape)} dim={dim}"
            common = dict(dtype=dtype_name(dtype), device_only=True, same_bytes_copy=True,
                          reps=20)

            moved = 3 * numel * esize
            sets = _inputs(shape, dtype, device, n_sets(moved, cap=3))
            forward = _peer("forward", _associative_linear_scan)
            out.append(Case(
                f"linear_scan fwd {label}", bytes_moved=moved,
                ours=rotate([lambda a=a, b=b: bt.linear_scan(a, b, dim) for a, b, _ in sets]),
                peer=rotate([lambda a=a, b=b: forward(a, b, dim) for a, b, _ in sets]),
                peer_name="torch.compile(associative_scan)", **common))

            moved = 5 * numel * esize
            ours_fns = []
            for a, b, dh in sets:
                la, lb = a.detach().requires_grad_(), b.detach().requires_grad_()
                h = bt.linear_scan(la, lb, dim)
                ours_fns.append(lambda h=h, la=la, lb=lb, dh=dh: torch.autograd.grad(
                    h, (la, lb), dh, retain_graph=True))
            out.append(Case(f"linear_scan bwd {label}", bytes_moved=moved,
                            ours=rotate(ours_fns), peer=rotate(_backward_peer(sets, dim)),
                            peer_name="torch.compile(associative_scan) gradient, written out",
                            **common))
    return out
