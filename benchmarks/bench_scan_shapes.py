"""Scans on shapes users meet, against torch: every op forward and backward
(float32 and bfloat16) on many short rows, on short and long rows, a middle dimension with wide,
narrow and odd inner sizes, and a row length that is no multiple of
anything. The issue's three shapes are in ``bench_scan.py``; these are here
so that no shape a model uses is slower than torch without anyone seeing it.

Cases moving under 4 MB are timed host included (``device_only`` off), as a
caller sees them: there the launch and the op's own host work are most of
the time. Larger ones are timed on the device alone, as ``bench_scan.py``
times. Inputs, bytes moved and peers are those of ``bench_scan.py``.

The dtypes are float32 and bfloat16 unless ``BENCH_SCAN_DTYPES`` names
others (comma-separated torch dtype names, e.g. ``float64,float16``).
"""

import os

import torch

from bench_scan import OPS, _backward_case, _forward_cases

# (shape, dim) pairs.
SHAPES = [
    ((32, 128), -1),           # a batch of short sequences
    ((1 << 20, 16), -1),       # many short rows (a thread per row)
    ((1 << 18, 64), -1),       # many rows of a few dozen
    ((1 << 16, 256), -1),
    ((8192, 1000), -1),        # rows just under row_groups' limit of 1024
    ((256, 4096), -1),
    ((32, 32768), -1),
    ((8, 262144), -1),         # a few long rows (long_rows)
    ((1, 1000003), -1),        # odd length
    ((2, 2400128), -1),        # long rows whose last tile is short
    ((16, 2048, 64), 1),       # a middle dim, 64 wide
    ((64, 512, 128), 1),
    ((1, 4096, 1024), 1),      # a hidden dim: 32 strips of 32 columns (strip_tiles)
    ((4, 2048, 1024), 1),      # 128 strips (column_strips)
    ((8, 4096, 3), 1),         # a narrow inner dim
    ((128, 1000, 7), 1),
    ((4096, 96), 0),           # few columns
]
HOST_INCLUDED_BELOW = 4 << 20


def _dtypes():
    names = os.environ.get("BENCH_SCAN_DTYPES", "float32,bfloat16")
    out = []
    for name in names.split(","):
        dtype = getattr(torch, name.strip(), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"BENCH_SCAN_DTYPES: {name!r} is not a floating torch dtype")
        out.append(dtype)
    return out


def _label(shape, dim):
    return f"{list(shape)} dim={dim}"


def cases(device, quick=False):
    shapes = [((4, 64), -1), ((8, 40, 3), 1)] if quick else SHAPES
    out = []
    for dtype in _dtypes():
        for shape, dim in shapes:
            for name in OPS:
                label = _label(shape, dim)
                group = _forward_cases(name, shape, dim, dtype, device, label)
                group = group[:1]  # torch.compile's peer: bench_scan.py has it
                group.append(_backward_case(name, shape, dim, dtype, device, label))
                for case in group:
                    case.device_only = case.bytes_moved >= HOST_INCLUDED_BELOW
                out += group
    return out
