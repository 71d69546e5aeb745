"""Merging partial attention states (cascade / split-KV attention).

An attention state over a set of keys is ``(v, s)``: ``v`` the softmax-weighted
value vector and ``s`` the log-sum-exp of the scores. States over disjoint key
sets merge exactly::

    m = max(s_a, s_b);  w_a = b^(s_a - m);  w_b = b^(s_b - m)
    v = (w_a v_a + w_b v_b) / (w_a + w_b);  s = m + log_b(w_a + w_b)

with ``b = 2`` (``lse_base="2"``, FlashInfer's convention) or ``b = e``
(``lse_base="e"``: the natural-log LSE that PyTorch's SDPA, FlexAttention and
FlashAttention return, so their outputs merge without rescaling).

The empty state ``(v = 0, s = -inf)`` -- attention over no keys -- is the
neutral element: merging two empty states gives an empty state, merging any
state with an empty one returns it bit for bit, and no NaN appears in the
forward or backward pass (an empty side gets zero gradients).

NaN in, NaN out: a NaN LSE carries no weight one could use, and an LSE of
``+inf`` an infinite one, whose share ``inf / inf`` of the cell is undefined
(as in ``torch.softmax``). A cell with either in any of its states merges to
``v = NaN`` (every element) and ``s = NaN``, and every gradient reaching that
cell's states is NaN. A NaN in ``v`` of a non-empty state gives NaN in that
cell's ``v`` only (``s`` does not depend on ``v``).

Shapes (any strides; extra leading batch axes allowed):

================  ==========================  ======================
op                v                           s
================  ==========================  ======================
merge_state       ``[..., heads, dim]``       ``[..., heads]``
merge_states      ``[..., n, heads, dim]``    ``[..., n, heads]``
================  ==========================  ======================

``v`` is float16, bfloat16, float32 or float64 (half types accumulate in
float32); ``s`` is float32, or float64 with float64 ``v``. Any head dim.
"""

from typing import Tuple

import torch
from torch import Tensor

_OPS = torch.ops.baracuda


def merge_state(v_a: Tensor, s_a: Tensor, v_b: Tensor, s_b: Tensor, *,
                lse_base: str = "2") -> Tuple[Tensor, Tensor]:
    """Merge two attention states; returns the merged ``(v, s)``.

    Differentiable with respect to all four inputs (one fused backward kernel).

    Example::

        >>> out_prefix, lse_prefix = ...   # attention over a shared prefix
        >>> out_suffix, lse_suffix = ...   # attention over each request's suffix
        >>> out, lse = merge_state(out_prefix, lse_prefix, out_suffix, lse_suffix,
        ...                        lse_base="e")
    """
    return _OPS.merge_state.default(v_a, s_a, v_b, s_b, lse_base)


def merge_state_(v: Tensor, s: Tensor, v_other: Tensor, s_other: Tensor, *,
                 lse_base: str = "2") -> Tuple[Tensor, Tensor]:
    """In-place :func:`merge_state`: ``(v, s) <- merge((v, s), (v_other, s_other))``.

    Returns ``(v, s)``. ``v``/``s`` must not share memory with the other
    state (except being the very same tensors). Not differentiable: with
    grad mode on, an input that requires grad is refused before anything is
    written (use :func:`merge_state`). Bumps the version counters of ``v``
    and ``s``.
    """
    _OPS.merge_state_.default(v, s, v_other, s_other, lse_base)
    return v, s


def merge_states(v: Tensor, s: Tensor, *, lse_base: str = "2") -> Tuple[Tensor, Tensor]:
    """Merge ``n`` attention states stacked along axis ``-3`` of ``v`` (``-2``
    of ``s``): ``[..., n, heads, dim]`` -> ``[..., heads, dim]``. ``n = 0``
    gives the empty state. Differentiable.

    Example::

        >>> v = torch.randn(4096, 8, 32, 128)           # 8 partial states per token
        >>> s = torch.randn(4096, 8, 32)
        >>> out, lse = merge_states(v, s)               # [4096, 32, 128], [4096, 32]
    """
    return _OPS.merge_states.default(v, s, lse_base)


# ---------------------------------------------------------------- fake kernels
#
# These are also the ops' Meta kernels, and a call with one meta tensor among
# tensors of another device dispatches to Meta: the device check of the real
# kernels is repeated here, or merge_state_ would silently write nothing and
# the others return uninitialised tensors.


def _check_devices(op: str, ref: Tensor, *states) -> None:
    """states: (v_name, s_name, v, s); an s of None (grad_s) is not checked."""
    for v_name, s_name, v, s in states:
        s_device = ref.device if s is None else s.device
        if v.device != ref.device or s_device != ref.device:
            raise RuntimeError(f"baracuda::{op}: {v_name} and {s_name} must be on {ref.device}, "
                               f"got {v.device} and {s_device}")


@torch.library.register_fake("baracuda::merge_state")
def _merge_state_fake(v_a, s_a, v_b, s_b, lse_base="2"):
    _check_devices("merge_state", v_a, ("v_a", "s_a", v_a, s_a), ("v_b", "s_b", v_b, s_b))
    return v_a.new_empty(v_a.shape), s_a.new_empty(s_a.shape)


@torch.library.register_fake("baracuda::merge_state_")
def _merge_state__fake(v, s, v_other, s_other, lse_base="2"):
    _check_devices("merge_state_", v, ("v", "s", v, s), ("v_other", "s_other", v_other, s_other))
    return None


@torch.library.register_fake("baracuda::merge_states")
def _merge_states_fake(v, s, lse_base="2"):
    _check_devices("merge_states", v, ("v", "s", v, s))
    v_shape = v.shape[:-3] + v.shape[-2:]
    s_shape = s.shape[:-2] + s.shape[-1:]
    return v.new_empty(v_shape), s.new_empty(s_shape)


@torch.library.register_fake("baracuda::merge_state_backward")
def _merge_state_backward_fake(grad_v, grad_s, v_a, s_a, v_b, s_b, lse_base):
    _check_devices("merge_state_backward", v_a, ("grad_v", "grad_s", grad_v, grad_s),
                   ("v_a", "s_a", v_a, s_a), ("v_b", "s_b", v_b, s_b))
    return (v_a.new_empty(v_a.shape), s_a.new_empty(s_a.shape),
            v_a.new_empty(v_a.shape), s_a.new_empty(s_a.shape))


@torch.library.register_fake("baracuda::merge_states_backward")
def _merge_states_backward_fake(grad_v, grad_s, v, s, lse_base):
    _check_devices("merge_states_backward", v, ("grad_v", "grad_s", grad_v, grad_s),
                   ("v", "s", v, s))
    return v.new_empty(v.shape), s.new_empty(s.shape)
