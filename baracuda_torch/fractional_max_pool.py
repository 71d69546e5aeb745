"""Fractional max pooling, 2-D and 3-D: a drop-in for PyTorch's, with a
deterministic backward.

Each output cell takes the maximum over a ``kernel_size`` window of the input
whose start along each axis is placed pseudo-randomly per ``(n, c)`` plane by
that plane's sample ``u`` in ``[0, 1)``:

* ``placement="torch"`` (default): PyTorch's windows, ``start(o) =
  int((o + u) * alpha) - int(u * alpha)`` with ``alpha = (in - k) / (out - 1)``
  and the last window flush with the input's end. Given the same samples,
  outputs and indices are bit-identical to ``torch.nn.functional``'s.
* ``placement="even"``: evenly spaced windows shifted by the sample,
  ``start(o) = clamp(floor(o * (in - k) / (out - 1) + u), 0, in - k)`` (and
  ``floor(u * (in - k))`` for a single cell), in float64.

Samples: ``[N, C, 2]`` (2-D, ordered ``(w, h)`` as PyTorch's) or ``[N, C, 3]``
(3-D, ordered ``(t, h, w)``), in the input's dtype or float32, ``N = 1`` for an
unbatched input. Without ``_random_samples`` they are drawn exactly as
PyTorch draws them (``torch.rand`` on the input's device), so the same seed
gives the same windows.

Indices are int64, flat within each ``(n, c)`` plane (``h * W + w``, or
``(t * H + h) * W + w``). The backward is its own op, a gather without
atomics: bit-identical from run to run, and allowed under
``torch.use_deterministic_algorithms(True)``; double backward works.

Shapes (any strides, channels_last too):

==========  ============================  ===============================
op          input                         output / indices
==========  ============================  ===============================
2-D         ``[N, C, H, W]``, ``[C, H, W]``  ``[.., C, oH, oW]``
3-D         ``[N, C, T, H, W]``, ``[C, T, H, W]``  ``[.., C, oT, oH, oW]``
==========  ============================  ===============================

Dtypes float16, bfloat16 (compared and accumulated in float32), float32,
float64.
"""

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor


_OPS = torch.ops.baracuda

Size = Union[int, Sequence[int]]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _tuple(value, dims: int, name: str) -> Tuple:
    if isinstance(value, (int, float)):
        return (value,) * dims
    value = tuple(value)
    if len(value) != dims:
        raise ValueError(f"fractional_max_pool{dims}d: {name}={value} must have {dims} entries")
    return value


def check_size_arguments(who: str, dims: int, output_size, output_ratio) -> None:
    """Exactly one of output_size / output_ratio, ratios inside (0, 1); shared
    by the functions and the nn modules (which check at construction)."""
    if (output_size is None) == (output_ratio is None):
        raise ValueError(f"{who}: give exactly one of output_size and output_ratio "
                         f"(got output_size={output_size}, output_ratio={output_ratio})")
    if output_ratio is not None:
        for r in _tuple(output_ratio, dims, "output_ratio"):
            if not 0 < r < 1:
                raise ValueError(f"{who}: output_ratio={output_ratio} must lie in (0, 1)")


def _sizes(value, dims: int, name: str) -> list:
    """``value`` as a list of ``dims`` entries; a plain int, the common call,
    without the general parsing (host time per call)."""
    return [value] * dims if type(value) is int else list(_tuple(value, dims, name))


def _output_size(x: Tensor, dims: int, output_size, output_ratio) -> list:
    if output_ratio is None and output_size is not None:
        return _sizes(output_size, dims, "output_size")
    check_size_arguments(f"fractional_max_pool{dims}d", dims, output_size, output_ratio)
    ratio = _tuple(output_ratio, dims, "output_ratio")
    spatial = x.shape[-dims:]
    return [int(size * r) for size, r in zip(spatial, ratio)]


def _pool(x: Tensor, dims: int, kernel_size: Size, output_size, output_ratio,
          return_indices: bool, samples: Optional[Tensor], placement: str):
    if x.dim() not in (dims + 1, dims + 2):
        raise ValueError(f"fractional_max_pool{dims}d: x.dim()={x.dim()} must be {dims + 1} "
                         f"(C, spatial) or {dims + 2} (N, C, spatial)")
    kernel = _sizes(kernel_size, dims, "kernel_size")
    out_size = _output_size(x, dims, output_size, output_ratio)
    if samples is None:
        if x.dtype not in _DTYPES:
            # The op checks x's dtype too, but only after the samples are
            # drawn in it, and torch.rand fails on an integer dtype with a
            # message about its sampler.
            raise RuntimeError(f"fractional_max_pool{dims}d: x.dtype={x.dtype} is not supported; "
                               "use float16, bfloat16, float32 or float64")
        batch = 1 if x.dim() == dims + 1 else x.size(0)
        samples = torch.rand(batch, x.size(-dims - 1), dims, dtype=x.dtype, device=x.device)
    out, indices = _OPS.fractional_max_pool.default(x, kernel, out_size, samples, placement)
    return (out, indices) if return_indices else out


def fractional_max_pool2d(x: Tensor, kernel_size: Size, output_size: Optional[Size] = None,
                          output_ratio=None, return_indices: bool = False,
                          _random_samples: Optional[Tensor] = None, *,
                          placement: str = "torch"):
    """2-D fractional max pooling over ``[N, C, H, W]`` or ``[C, H, W]``; the
    signature of ``torch.nn.functional.fractional_max_pool2d`` plus
    ``placement`` (see the module docstring).

    Example::

        >>> x = torch.randn(8, 64, 112, 112, device="cuda", requires_grad=True)
        >>> y, idx = fractional_max_pool2d(x, 3, output_size=56, return_indices=True)
        >>> y.sum().backward()          # deterministic, no atomics
    """
    return _pool(x, 2, kernel_size, output_size, output_ratio, return_indices,
                 _random_samples, placement)


def fractional_max_pool3d(x: Tensor, kernel_size: Size, output_size: Optional[Size] = None,
                          output_ratio=None, return_indices: bool = False,
                          _random_samples: Optional[Tensor] = None, *,
                          placement: str = "torch"):
    """3-D fractional max pooling over ``[N, C, T, H, W]`` or ``[C, T, H, W]``;
    the signature of ``torch.nn.functional.fractional_max_pool3d`` plus
    ``placement`` (see the module docstring)."""
    return _pool(x, 3, kernel_size, output_size, output_ratio, return_indices,
                 _random_samples, placement)


# ---------------------------------------------------------------- fake kernels


def _with_spatial(shape, dims, spatial):
    return list(shape[:len(shape) - dims]) + list(spatial)


# These are also the ops' Meta kernels, and a call with one meta tensor among
# tensors of another device dispatches to Meta: the device check of the real
# kernels is repeated here, or such a call would return uninitialised tensors.


def _check_device(op: str, name: str, t: Tensor, ref_name: str, ref: Tensor) -> None:
    if t.device != ref.device:
        raise RuntimeError(f"baracuda::{op}: {name} is on {t.device} but {ref_name} is on "
                           f"{ref.device}")


@torch.library.register_fake("baracuda::fractional_max_pool")
def _fractional_max_pool_fake(x, kernel_size, output_size, samples, placement="torch"):
    _check_device("fractional_max_pool", "samples", samples, "the input", x)
    shape = _with_spatial(x.shape, len(kernel_size), output_size)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.long)


@torch.library.register_fake("baracuda::fractional_max_pool_backward")
def _fractional_max_pool_backward_fake(grad_out, indices, samples, input_size, kernel_size,
                                       placement="torch"):
    _check_device("fractional_max_pool_backward", "samples", samples, "the input", grad_out)
    _check_device("fractional_max_pool_backward", "indices", indices, "grad_out", grad_out)
    return grad_out.new_empty(input_size)
