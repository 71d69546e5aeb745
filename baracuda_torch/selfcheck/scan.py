"""Main-job rows of the scan family: float64 torch references, timed against
torch's own op (forward) and torch's op through autograd (backward)."""

import torch

import baracuda_torch as bt

from . import Check

_TOL = {torch.bfloat16: 3e-2, torch.float32: 1e-3, torch.float64: 1e-9}


def _values(out):
    return out[0] if isinstance(out, tuple) else out


def _forward_case(device, name, dtype, shape, dim):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, generator=g, device=device).to(dtype)
    if name == "cumprod":
        x = 1 + 1e-3 * x
    ours = lambda: _values(getattr(bt, name)(x, dim))  # noqa: E731
    reference = lambda: _values(getattr(torch, name)(x.double(), dim))  # noqa: E731
    peer = lambda: getattr(torch, name)(x, dim)  # noqa: E731
    scale = max(1.0, shape[dim] ** 0.5) if name == "cumsum" else 1.0
    return Check(f"{name} dim={dim}", dtype, "x".join(map(str, shape)), ours, reference, peer,
                 tolerance=_TOL[dtype] * scale)


def _backward_case(device, name, dtype, shape, dim):
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(shape, generator=g, device=device).to(dtype)
    if name == "cumprod":
        x = 1 + 1e-3 * x
    dy = torch.randn(shape, generator=g, device=device).to(dtype)

    def grad_of(fn, t):
        leaf = t.detach().requires_grad_()
        out = _values(fn(leaf, dim))
        return torch.autograd.grad(out, leaf, dy.to(t.dtype))[0]

    ours = lambda: grad_of(getattr(bt, name), x)  # noqa: E731
    reference = lambda: grad_of(getattr(torch, name), x.double())  # noqa: E731
    peer = lambda: grad_of(getattr(torch, name), x)  # noqa: E731
    scale = max(1.0, shape[dim] ** 0.5)
    return Check(f"{name} backward dim={dim}", dtype, "x".join(map(str, shape)), ours,
                 reference, peer, tolerance=_TOL[dtype] * scale)


def checks(device):
    rows, cols = (1024, 2048) if device.type == "cuda" else (64, 128)
    out = []
    for name in ("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"):
        out.append(_forward_case(device, name, torch.float32, (rows, cols), -1))
        out.append(_backward_case(device, name, torch.float32, (rows, cols), 0))
    out.append(_forward_case(device, "cumsum", torch.bfloat16, (rows, cols), 0))
    long_len = (1 << 22) if device.type == "cuda" else 50000  # the long_rows path
    out.append(_forward_case(device, "cummax", torch.float32, (1, long_len), -1))
    out.append(_backward_case(device, "cumsum", torch.float32, (1, long_len), -1))
    out.append(_forward_case(device, "logcumsumexp", torch.float64, (8, 1000), -1))
    return out
