"""write_slice: bit-exact writes of a source slab into a window of a tensor.

The KV-cache append primitive. ``dest[start_0:end_0, ..., start_{N-1}:end_{N-1}]
= source``: assignment (never accumulation), no arithmetic, every byte of
``dest`` outside the window left as it was.

Paths, chosen once per call (``write_slice_path`` reports which):

* ``whole_dest``       -- the window is all of dest and both tensors are one
                          dense run of memory: a single device copy;
* ``contiguous_chunk`` -- the window and the source are one dense run each
                          (e.g. whole rows of a row-major cache): a single copy;
* ``strided:W``        -- anything else: one kernel over the strided window,
                          moving W-byte units (W = 16 when alignment allows);
* ``nibble``           -- packed int4 whose innermost window edge falls inside
                          a byte: bytes are patched nibble by nibble;
* ``empty``            -- nothing to write.

Every dtype is supported: the kernels copy bytes, dispatched on element size
(1, 2, 4, 8 or 16 bytes), so bool, all integer widths, float8, float16,
bfloat16, float32/64 and complex32/64/128 behave alike.

Packed int4 (``packed_int4=True``): ``dest`` and ``source`` are uint8 tensors
holding two 4-bit values per byte along the innermost axis, value ``2j`` in the
low nibble of byte ``j``. Innermost ranges then count 4-bit values, so a dest
of innermost size ``n`` bytes has ``2n`` positions. Window edges may be odd
(the neighbouring nibble of a shared byte is preserved); the window's length
must be even, since the source holds whole bytes: ``source.shape[-1] * 2 ==
end - start``.
"""

from typing import Sequence, Tuple, Union

import torch
from torch import Tensor

IntLike = Union[int, torch.SymInt]

_OPS = torch.ops.baracuda
Range = Union[Tuple[IntLike, IntLike], slice]


def _flatten_ranges(op: str, ranges: Sequence[Range]) -> list:
    # Fast path for the common case, a list of (start, end) tuples: this
    # wrapper sits on the per-token decode path, where host time is most of
    # the call's time, and tuple concatenation is the cheapest flattening.
    try:
        flat = sum(ranges, ())
        if len(flat) == 2 * len(ranges):
            return flat
    except TypeError:  # lists, slices or bad entries: the careful path below
        pass
    flat = []
    for axis, r in enumerate(ranges):
        if isinstance(r, slice):
            if r.step not in (None, 1) or r.start is None or r.stop is None:
                raise ValueError(
                    f"baracuda::{op}: ranges[{axis}]={r!r} must be a slice with explicit "
                    "start and stop and step 1, or a (start, end) pair"
                )
            flat += [r.start, r.stop]
            continue
        try:
            start, end = r
        except (TypeError, ValueError):
            raise ValueError(
                f"baracuda::{op}: ranges[{axis}]={r!r} must be a (start, end) pair"
            ) from None
        flat += [start, end]
    return flat


def write_slice_(
    dest: Tensor, source: Tensor, ranges: Sequence[Range], *, packed_int4: bool = False
) -> Tensor:
    """Write ``source`` into ``dest[ranges]`` in place and return ``dest``.

    Args:
        dest: tensor of rank 0 to 8, any dtype and strides (no internal overlap).
        source: same dtype, device and rank; ``source.shape[d] == end_d - start_d``.
            Any strides, including expanded (stride 0) ones.
        ranges: one ``(start, end)`` pair (or ``slice(start, end)``) per axis of
            ``dest``, with ``0 <= start <= end <= dest.shape[d]``. A rank-0 dest
            takes ``[]`` and is overwritten by the rank-0 source.
        packed_int4: treat uint8 tensors as two int4 values per byte along the
            innermost axis (see the module docstring).

    Raises before writing anything if ranks, ranges, shapes, dtypes or devices
    disagree, if ``dest`` has internal overlap, or if ``source`` shares memory
    with the window being written.

    Differentiable as ``dest[window].copy_(source)`` is: ``dest`` takes the
    write as its history (the gradient to its earlier history is the incoming
    gradient with the window zeroed, that of ``source`` the incoming
    gradient's window), its version counter is bumped, and a leaf that
    requires grad is refused, as torch refuses in-place ops on one.

    Example::

        >>> cache = torch.zeros(2, 8, 4096, 128, dtype=torch.bfloat16)
        >>> kv = torch.randn(2, 8, 1, 128, dtype=torch.bfloat16)
        >>> pos = 17
        >>> write_slice_(cache, kv, [(0, 2), (0, 8), (pos, pos + 1), (0, 128)])
    """
    _OPS.write_slice_.default(
        dest, source, _flatten_ranges("write_slice_", ranges), packed_int4
    )
    return dest


def write_slice(
    dest: Tensor, source: Tensor, ranges: Sequence[Range], *, packed_int4: bool = False
) -> Tensor:
    """Out-of-place :func:`write_slice_`: a copy of ``dest`` with the window replaced.

    Differentiable with respect to both inputs: the gradient of ``dest`` is the
    incoming gradient with the window zeroed, that of ``source`` is the
    incoming gradient's window. The result has ``dest``'s strides when ``dest``
    is dense (as ``torch.clone`` keeps them), otherwise it is contiguous.

    Example::

        >>> x = torch.zeros(4, 6, requires_grad=True)
        >>> y = write_slice(x, torch.ones(2, 3), [(1, 3), (0, 3)])
    """
    return _OPS.write_slice.default(
        dest, source, _flatten_ranges("write_slice", ranges), packed_int4
    )


def write_slice_at_(
    dest: Tensor, source: Tensor, dim: int, offsets: Tensor, *, packed_int4: bool = False
) -> Tensor:
    """Write ``source`` into ``dest`` at an offset along ``dim`` read from a tensor.

    ``source`` has ``dest``'s shape except along ``dim``, where its length ``L``
    is the number of positions written. ``offsets`` is an int64 tensor on
    ``dest``'s device of shape

    * ``[]``: ``dest.narrow(dim, offsets, L).copy_(source)``;
    * ``[dest.shape[0]]`` (``dim > 0``): row ``b`` writes at its own offset,
      ``dest[b].narrow(dim - 1, offsets[b], L).copy_(source[b])`` -- the ragged
      KV-cache append of a batch of sequences with different lengths.

    The offset is read on the device, so there is no host synchronisation and
    a decode step captured once in a CUDA graph appends at the position held
    in ``offsets`` at each replay.

    Out-of-range offsets (``offset < 0`` or ``offset + L > dest.shape[dim]``):
    on CUDA that row (or, for a scalar offset, the whole write) is skipped and
    writes nothing -- checking would need a host synchronisation; on CPU the
    call raises before writing anything.

    With ``packed_int4=True`` and ``dim`` the innermost axis, offsets and ``L``
    count 4-bit values (odd offsets are fine).

    Differentiable as :func:`write_slice_` is; the gradients are gathered at
    the offsets on the device (a row the CUDA write skipped passes its whole
    gradient to ``dest``'s history and none to ``source``).

    Example::

        >>> cache = torch.zeros(4, 8, 1024, 64)
        >>> lengths = torch.tensor([5, 0, 17, 3])
        >>> write_slice_at_(cache, torch.randn(4, 8, 1, 64), 2, lengths)
    """
    _OPS.write_slice_at_.default(dest, source, dim, offsets, packed_int4)
    return dest


def write_slice_path(
    dest: Tensor, source: Tensor, ranges: Sequence[Range], *, packed_int4: bool = False
) -> str:
    """Name of the path :func:`write_slice_` takes for these arguments.

    One of ``"whole_dest"``, ``"contiguous_chunk"``, ``"strided:W"`` (W = unit
    width in bytes), ``"nibble"`` or ``"empty"``. Validates like the op itself.
    """
    return _OPS.write_slice_path.default(
        dest, source, _flatten_ranges("write_slice_path", ranges), packed_int4
    )


# ---------------------------------------------------------------- fake kernels
#
# These are also the ops' Meta kernels, and a call with one meta tensor among
# tensors of another device dispatches to Meta: the device check of the real
# kernels must be repeated here, or such a call would silently write nothing.


def _check_devices(op: str, dest: Tensor, **others: Tensor) -> None:
    for name, t in others.items():
        if t.device != dest.device:
            raise RuntimeError(
                f"baracuda::{op}: {name}.device={t.device} must equal dest.device={dest.device}"
            )


@torch.library.register_fake("baracuda::write_slice_")
def _write_slice__fake(dest, source, ranges, packed_int4=False):
    _check_devices("write_slice_", dest, source=source)
    return None


@torch.library.register_fake("baracuda::write_slice_at_")
def _write_slice_at__fake(dest, source, dim, offsets, packed_int4=False):
    _check_devices("write_slice_at_", dest, source=source, offsets=offsets)
    return None


@torch.library.register_fake("baracuda::write_slice")
def _write_slice_fake(dest, source, ranges, packed_int4=False):
    _check_devices("write_slice", dest, source=source)
    # Same layout rule as the real kernel's clone (preserve_format).
    return torch.empty_like(dest)
