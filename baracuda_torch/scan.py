"""Scans along one axis: cumsum, cumprod, logcumsumexp, cummax, cummin.

Each op equals its ``torch`` namesake (``torch.cumsum``, ...), plus a
``reverse`` flag: ``reverse=True`` scans from the last element to the first,
exactly like flipping, scanning and flipping back, with cummax / cummin
indices in the original coordinates.

====================  =======================  ==========================
op                    returns                  backward reads (besides dy)
====================  =======================  ==========================
``cumsum``            ``y``                    --
``cumprod``           ``y``                    ``x``, ``y``
``logcumsumexp``      ``y``                    ``x``, ``y``
``cummax``/``cummin``  ``(values, indices)``    ``indices``
====================  =======================  ==========================

Dtypes: float16, bfloat16, float32, float64 (half types accumulate in
float32), and integer and bool inputs as torch takes them: ``cumsum`` /
``cumprod`` of integers and bool give int64 (wrapping on overflow, as
torch), or scan in ``dtype=`` when given (``x`` is cast to it first, as
``torch.cumsum(x, dim, dtype=...)``; uint8, int8, int16, int32, int64 or a
float type); ``cummax`` / ``cummin`` keep bool, uint8, int8, int16, int32 and
int64 values; ``logcumsumexp`` takes float types only. Integer results have
no gradient; an integer ``dtype=`` for an ``x`` that requires grad is an
error, as in torch.
Any ``dim`` (negative too), any rank (a 0-d tensor scans as one element), any
strides (a non-contiguous input is copied once), empty tensors. Results are
contiguous and bit-identical run to run.

Numerics:

* ``cummax`` / ``cummin`` follow torch: a later element wins ties; a NaN
  wins from where it appears on, and a later NaN takes its index over.
* ``logcumsumexp``: an all ``-inf`` prefix gives ``-inf``, never NaN, and its
  gradient is 0; inputs of magnitude 1e4 stay finite.
* ``cumprod``'s gradient never divides by ``x``: exact with one or several
  zeros.

Every op is differentiable; the backward is one op, ``scan_backward``, for
every kind, and is itself differentiable (double backward works). cummax /
cummin backward sends each gradient to the index the forward returned,
without scatter or atomics, so it is deterministic.
"""

from typing import Optional

import torch
from torch import Tensor

_OPS = torch.ops.baracuda


def cumsum(x: Tensor, dim: int, *, dtype: torch.dtype = None, reverse: bool = False) -> Tensor:
    """Cumulative sum of ``x`` along ``dim``: ``y_i = x_0 + ... + x_i``
    (``y_i = x_i + ... + x_{n-1}`` with ``reverse=True``), in ``dtype`` when
    given (``x`` cast to it first), else int64 for integer and bool ``x``.

    Example::

        >>> cumsum(torch.tensor([1., 2., 3.]), 0)
        tensor([1., 3., 6.])
        >>> cumsum(torch.tensor([1., 2., 3.]), 0, reverse=True)
        tensor([6., 5., 3.])
        >>> cumsum(torch.tensor([True, False, True]), 0)  # position ids from a mask
        tensor([1, 1, 2])
    """
    return _OPS.cumsum.default(x, dim, reverse, dtype)


def cumprod(x: Tensor, dim: int, *, dtype: torch.dtype = None, reverse: bool = False) -> Tensor:
    """Cumulative product of ``x`` along ``dim``, in ``dtype`` as
    :func:`cumsum`. Its gradient is exact when ``x`` holds zeros (no division
    by ``x``).

    Example::

        >>> cumprod(torch.tensor([2., 0., 3.]), 0)
        tensor([2., 0., 0.])
    """
    return _OPS.cumprod.default(x, dim, reverse, dtype)


def logcumsumexp(x: Tensor, dim: int, *, reverse: bool = False) -> Tensor:
    """``y_i = log(exp(x_0) + ... + exp(x_i))`` along ``dim``, without
    overflow. Leading ``-inf`` give ``-inf`` (and zero gradients).

    Example::

        >>> logcumsumexp(torch.tensor([float("-inf"), 0., 0.]), 0)
        tensor([  -inf, 0.0000, 0.6931])
    """
    return _OPS.logcumsumexp.default(x, dim, reverse)


def cummax(x: Tensor, dim: int, *, reverse: bool = False):
    """Running maximum of ``x`` along ``dim`` and where it was found, as
    ``torch.return_types.cummax(values, indices)`` (indices int64). Ties go
    to the later element; a NaN, once met, is the maximum from then on (with
    the index of the latest NaN).

    Example::

        >>> cummax(torch.tensor([1., 3., 2., 3.]), 0)
        torch.return_types.cummax(values=tensor([1., 3., 3., 3.]), indices=tensor([0, 1, 1, 3]))
    """
    values, indices = _OPS.cummax.default(x, dim, reverse)
    return torch.return_types.cummax((values, indices))


def cummin(x: Tensor, dim: int, *, reverse: bool = False):
    """Running minimum of ``x`` along ``dim`` and its indices, as
    ``torch.return_types.cummin(values, indices)``; ties and NaN as
    :func:`cummax`."""
    values, indices = _OPS.cummin.default(x, dim, reverse)
    return torch.return_types.cummin((values, indices))


def scan_path(x: Tensor, dim: int, kind: Optional[str] = None, *, backward: bool = False,
              reverse: bool = False, dtype: Optional[torch.dtype] = None) -> str:
    """Which CUDA path a scan of ``x`` along ``dim`` takes, and with ``kind``
    (``"cumsum"``, ..., ``"cummin"``, ``"linear_scan"``) which kernel that op
    runs.

    Without ``kind``, the path of the shape alone: ``row_groups`` (scan axis
    innermost, rows of at most 1024: a group of 2 to 32 lanes per row),
    ``rows`` (longer rows, a block per row), ``long_rows`` (few very long
    rows, cut into tiles), ``column_strips`` (scan axis not innermost,
    columns enough for 128 strips of 32: a block walks the axis per strip),
    ``strip_tiles`` (fewer strips, an axis of 33 to 4096 positions: a block
    per strip step), ``column_tiles`` (fewer columns, or strips' lanes
    mostly idle, or a longer axis, an axis of 17 to 32768 positions: one
    pass over tiles of 16 positions), ``columns`` (other non-innermost axes:
    a thread per column), ``integer`` (an integer scan: integer or bool
    ``x``, or an integer ``dtype``; on both devices the one engine of exact
    integer scans) or ``empty``.

    With ``kind``, the kernel the launcher itself chooses for that op (its
    ``backward``, ``reverse`` and cumsum / cumprod ``dtype``) on ``x``'s
    device, or on the current CUDA device for a meta ``x``, from the op, the
    arrays' alignment, the compiled targets and the GPU: ``row_groups``,
    ``warp_rows``, ``rows``, ``long_rows``, ``staged_rows``,
    ``swizzled_runs``, ``staged_extremes``, ``staged_cumprod_grad``,
    ``staged_logcumsumexp_grad``, ``swizzled_logcumsumexp_grad``,
    ``keyed_rows``, ``column_strips``, ``staged_strips``, ``strip_tiles``,
    ``long_strip_tiles``, ``column_tiles``, ``columns`` (the design notes,
    docs/design/scan.md, describe each), ``integer``, ``empty``, or
    ``host`` for a CPU ``x``. A meta ``x`` with no CUDA device raises."""
    return _OPS.scan_path.default(x, dim, kind, backward=backward, reverse=reverse, dtype=dtype)


# ---------------------------------------------------------------- fake kernels


def _fake_scan(x, dim, reverse=False):
    return x.new_empty(x.shape)


def _fake_scan_in_dtype(x, dim, reverse=False, dtype=None):
    if dtype is None:
        integral = not (x.dtype.is_floating_point or x.dtype.is_complex)
        dtype = torch.int64 if integral else x.dtype
    return x.new_empty(x.shape, dtype=dtype)


def _fake_scan_with_indices(x, dim, reverse=False):
    return x.new_empty(x.shape), x.new_empty(x.shape, dtype=torch.long)


for _name in ("cumsum", "cumprod"):
    torch.library.register_fake(f"baracuda::{_name}")(_fake_scan_in_dtype)
torch.library.register_fake("baracuda::logcumsumexp")(_fake_scan)
for _name in ("cummax", "cummin"):
    torch.library.register_fake(f"baracuda::{_name}")(_fake_scan_with_indices)


@torch.library.register_fake("baracuda::scan_backward")
def _scan_backward_fake(grad, x, y, indices, dim, kind, reverse):
    return grad.new_empty(grad.shape)


# ---------------------------------------------------------------- autograd
#
# Registered in C++ (kernels/scan/scan_autograd.cpp) for the five forward ops
# and for scan_backward (its double backward: kernels/scan/
# scan_double_backward.cpp): a Python autograd kernel would run on every
# call, with or without grad, and cost a small scan more host time than the
# scan.
