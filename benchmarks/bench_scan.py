"""Scan benchmark cases: cumsum, cumprod, logcumsumexp, cummax, cummin.

Peers: torch's op (forward; for cumsum also ``torch.compile(torch.cumsum)``)
and torch's backward alone (``torch.autograd.grad`` through torch's op on a
retained graph); ours backward is ``scan_backward`` on the saved tensors.
Timed on the device alone (``Case.device_only``): the target is a fraction
of copy bandwidth, which host launch gaps must not blur. Bytes moved are the
minimum: forward reads x and writes y (+ int64 indices for cummax / cummin);
backward reads dy and the saved tensors it needs (cumprod, logcumsumexp: x
and y; cummax / cummin: the indices) and writes dx. Each row also gives
ours against a copy of those same bytes (the runner's last column), beside
the 1 GiB copy roofline.
"""

import torch

import baracuda_torch as bt
from common import Case, dtype_name, n_sets, rotate

OPS = ["cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"]
_OPS = torch.ops.baracuda

_sets = {}


def _inputs(shape, dtype, device, count):
    """Shared (x, dy) sets per shape and dtype; cumprod-friendly x near 1."""
    key = (tuple(shape), dtype, device.type)
    if key not in _sets:
        out = []
        for _ in range(count):
            x = (1 + 1e-3 * torch.randn(shape, device=device)).to(dtype)
            dy = torch.randn(shape, device=device).to(dtype)
            out.append((x, dy))
        _sets[key] = out
    return _sets[key]


def _values(out):
    return out[0] if isinstance(out, tuple) else out


def _bytes(name, numel, esize, backward):
    if name in ("cummax", "cummin"):
        return numel * (2 * esize + 8)
    if backward and name in ("cumprod", "logcumsumexp"):
        return numel * 4 * esize
    return numel * 2 * esize


_compiled_cumsum = None


def _forward_cases(name, shape, dim, dtype, device, label):
    global _compiled_cumsum
    numel = torch.Size(shape).numel()
    moved = _bytes(name, numel, torch.empty((), dtype=dtype).element_size(), False)
    sets = _inputs(shape, dtype, device, n_sets(moved))
    ours = rotate([lambda x=x: getattr(bt, name)(x, dim) for x, _ in sets])
    peer = rotate([lambda x=x: getattr(torch, name)(x, dim) for x, _ in sets])
    common = dict(dtype=dtype_name(dtype), bytes_moved=moved, device_only=True,
                  same_bytes_copy=True)
    cases = [Case(f"{name} fwd {label}", ours=ours, peer=peer, peer_name=f"torch.{name}", **common)]
    if name == "cumsum":
        if _compiled_cumsum is None:
            _compiled_cumsum = torch.compile(torch.cumsum, dynamic=False)
        comp = rotate([lambda x=x: _compiled_cumsum(x, dim) for x, _ in sets])
        cases.append(Case(f"{name} fwd {label}", ours=ours, peer=comp,
                          peer_name="torch.compile(torch.cumsum)", **common))
    return cases


def _backward_case(name, shape, dim, dtype, device, label):
    numel = torch.Size(shape).numel()
    moved = _bytes(name, numel, torch.empty((), dtype=dtype).element_size(), True)
    sets = _inputs(shape, dtype, device, n_sets(moved))
    ours_fns, peer_fns = [], []
    for x, dy in sets:
        out = getattr(bt, name)(x, dim)
        y, idx = (out[0], out[1]) if name in ("cummax", "cummin") else (out, None)
        saved_x, saved_y = (x, y) if name in ("cumprod", "logcumsumexp") else (None, None)
        ours_fns.append(lambda dy=dy, sx=saved_x, sy=saved_y, idx=idx: _OPS.scan_backward.default(
            dy, sx, sy, idx, dim, name, False))
        leaf = x.detach().requires_grad_()
        torch_out = _values(getattr(torch, name)(leaf, dim))
        peer_fns.append(lambda o=torch_out, leaf=leaf, dy=dy: torch.autograd.grad(
            o, leaf, dy, retain_graph=True))
    return Case(f"{name} bwd {label}", dtype=dtype_name(dtype), bytes_moved=moved,
                ours=rotate(ours_fns), peer=rotate(peer_fns), peer_name=f"torch.{name} backward",
                device_only=True, same_bytes_copy=True)


def _integer_cases(device, rows, cols, long_len):
    """The integer engine: position ids from an attention mask (int64 cumsum
    of 0 / 1 along the sequence), int32 cummax along either axis (values of
    0..3: many ties), and one long int64 row (a single block walks it: the
    engine's weak shape). Bytes: x read, y (+ int64 indices) written."""
    specs = [("cumsum", torch.int64, (rows, cols), -1, 2),
             ("cumsum", torch.int64, (rows, cols), 0, 2),
             ("cummax", torch.int32, (rows, cols), -1, 4),
             ("cummax", torch.int32, (rows, cols), 0, 4),
             ("cumsum", torch.int64, (1, long_len), -1, 2)]
    out = []
    for name, dtype, shape, dim, high in specs:
        numel = torch.Size(shape).numel()
        esize = torch.empty((), dtype=dtype).element_size()
        moved = numel * (esize + 8) if name == "cumsum" else numel * (2 * esize + 8)
        sets = [torch.randint(0, high, shape, device=device, dtype=dtype)
                for _ in range(n_sets(moved))]
        label = f"{list(shape)} dim={dim}"
        out.append(Case(f"{name} fwd {label}", dtype=dtype_name(dtype), bytes_moved=moved,
                        ours=rotate([lambda x=x, f=getattr(bt, name), d=dim: f(x, d)
                                     for x in sets]),
                        peer=rotate([lambda x=x, f=getattr(torch, name), d=dim: f(x, d)
                                     for x in sets]),
                        peer_name=f"torch.{name}", device_only=True, same_bytes_copy=True))
    return out


def cases(device, quick=False):
    rows, cols, long_len = (64, 128, 4096) if quick else (4096, 8192, 1 << 24)
    shapes = [((rows, cols), -1, f"[{rows}, {cols}] dim=-1"),
              ((rows, cols), 0, f"[{rows}, {cols}] dim=0"),
              ((1, long_len), -1, f"[1, {long_len}]")]
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        for shape, dim, label in shapes:
            for name in OPS:
                out += _forward_cases(name, shape, dim, dtype, device, label)
                out.append(_backward_case(name, shape, dim, dtype, device, label))
    return out + _integer_cases(device, rows, cols, long_len)
