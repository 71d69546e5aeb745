"""The linear recurrence ``h_t = a_t * h_{t-1} + b_t`` along one axis: the
scan of state-space and linear-RNN layers (selective scans, linear attention
with decay, gated linear recurrences).

``linear_scan`` runs on the scan engine of ``cumsum`` and friends: one pass
over ``a`` and ``b`` writing ``h``, on CPU and CUDA, in a fixed association
(bit-identical results run to run). Its backward is one more pass of the
same engine, the reverse recurrence ``g_t = dh_t + a_{t+1} g_{t+1}``
(``db = g``, ``da_t = g_t h_{t-1}``): no division, so zeros in ``a`` are
exact. The backward is itself differentiable (double backward works).
"""

from typing import Optional

import torch
from torch import Tensor

_OPS = torch.ops.baracuda


def linear_scan(a: Tensor, b: Tensor, dim: int, *, reverse: bool = False,
                h0: Optional[Tensor] = None) -> Tensor:
    """``h_t = a_t * h_{t-1} + b_t`` along ``dim``, with ``h_{-1} = h0``
    (zero when ``h0`` is None); ``reverse=True`` runs from the last position
    to the first (``h_t = a_t * h_{t+1} + b_t``, ``h0`` the state after the
    last).

    ``a`` and ``b``: one shape and one dtype, float16, bfloat16 (both carried
    in float32 between steps), float32 or float64; any ``dim``, rank and
    strides (a non-contiguous input is copied once). ``h0``: a float tensor
    of ``a``'s shape without ``dim``, or one that broadcasts to it; with
    half types its first step ``a_0 * h0 + b_0`` is rounded to the dtype
    once. Returns ``h``, contiguous, in ``a``'s dtype; differentiable in
    ``a``, ``b`` and ``h0``.

    The steps are joined in a tree, which also forms products of ``a`` over
    stretches of the axis: where such a product overflows (``|a| > 1`` over
    hundreds of float32 steps), results can be inf or NaN where the
    step-by-step recurrence, whose ``h`` was 0 until then, is finite.

    Example::

        >>> a = torch.tensor([0.5, 0.5, 0.0, 2.0])
        >>> b = torch.tensor([1.0, 1.0, 1.0, 1.0])
        >>> linear_scan(a, b, 0)
        tensor([1.0000, 1.5000, 1.0000, 3.0000])
        >>> linear_scan(a, b, 0, h0=torch.tensor(4.0))
        tensor([3.0000, 2.5000, 1.0000, 3.0000])
    """
    return _OPS.linear_scan.default(a, b, dim, reverse, h0)


# ---------------------------------------------------------------- fake kernels
# Also the ops' Meta kernels: the checks of the real kernels that the shape
# alone decides are repeated, so that a traced call fails as an eager one.


def _check_like(op: str, name: str, t: Tensor, ref_name: str, ref: Tensor) -> None:
    if t.shape != ref.shape:
        raise RuntimeError(f"baracuda::{op}: {name}.shape={list(t.shape)} must equal "
                           f"{ref_name}.shape={list(ref.shape)}")
    if t.dtype != ref.dtype:
        raise RuntimeError(f"baracuda::{op}: {name}.dtype={t.dtype} must equal "
                           f"{ref_name}.dtype={ref.dtype}")
    if t.device != ref.device:
        raise RuntimeError(f"baracuda::{op}: {name} is on {t.device} but {ref_name} is on "
                           f"{ref.device}")


@torch.library.register_fake("baracuda::linear_scan")
def _linear_scan_fake(a, b, dim, reverse=False, h0=None):
    _check_like("linear_scan", "b", b, "a", a)
    return a.new_empty(a.shape)


@torch.library.register_fake("baracuda::linear_scan_backward")
def _linear_scan_backward_fake(grad, a, h, h0, dim, reverse):
    _check_like("linear_scan_backward", "a", a, "grad", grad)
    _check_like("linear_scan_backward", "h", h, "grad", grad)
    return grad.new_empty(grad.shape), grad.new_empty(grad.shape)


# ---------------------------------------------------------------- autograd
#
# Registered in C++ (kernels/scan/linear_scan_autograd.cpp), for linear_scan
# and for linear_scan_backward (the double backward), as for the other scans.
