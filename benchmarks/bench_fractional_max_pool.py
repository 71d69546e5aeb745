"""Fractional max pooling benchmark cases: the issue's 2-D and 3-D shapes,
forward and backward, float32 plus float16 / bfloat16 rows.

Peer: PyTorch's op with the same samples (forward) and its backward op
(``torch.ops.aten.fractional_max_pool{2,3}d_backward``, which on CUDA uses
atomics and is not deterministic). Bytes moved, minimal: forward reads x and
writes the output and its int64 indices; backward reads grad_out and the
indices and writes grad_x.
"""

import torch
import torch.nn.functional as F

import baracuda_torch as bt
from common import Case, dtype_name, n_sets, rotate

SHAPES = {2: ((32, 64, 112, 112), 3, (56, 56)), 3: ((8, 32, 32, 64, 64), 2, (16, 32, 32))}
QUICK = {2: ((2, 8, 28, 28), 3, (14, 14)), 3: ((1, 4, 8, 16, 16), 2, (4, 8, 8))}


def _cases(device, dims, dtype, shape, kernel, out_size):
    esize = torch.empty((), dtype=dtype).element_size()
    x_numel = torch.Size(shape).numel()
    out_numel = torch.Size(shape[:2] + out_size).numel()
    fw_bytes = x_numel * esize + out_numel * (esize + 8)
    bw_bytes = out_numel * (esize + 8) + x_numel * esize
    ours_fn = bt.fractional_max_pool2d if dims == 2 else bt.fractional_max_pool3d
    torch_fn = F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d
    torch_bw = (torch.ops.aten.fractional_max_pool2d_backward if dims == 2
                else torch.ops.aten.fractional_max_pool3d_backward)
    sets = []
    for _ in range(n_sets(fw_bytes)):
        x = torch.randn(shape, device=device).to(dtype)
        s = torch.rand(shape[0], shape[1], dims, device=device).to(dtype)
        y, idx = ours_fn(x, kernel, out_size, return_indices=True, _random_samples=s)
        sets.append((x, s, torch.randn_like(y), idx))
    kern = [kernel] * dims
    label = f"{dims}-D {list(shape)} k={kernel} -> {list(out_size)}"
    return [
        Case(f"fw {label}", dtype_name(dtype), fw_bytes,
             ours=rotate([lambda x=x, s=s: ours_fn(x, kernel, out_size, return_indices=True,
                                                   _random_samples=s) for x, s, _, _ in sets]),
             peer=rotate([lambda x=x, s=s: torch_fn(x, kernel, out_size, return_indices=True,
                                                    _random_samples=s) for x, s, _, _ in sets]),
             peer_name="torch"),
        Case(f"bw (deterministic) {label}", dtype_name(dtype), bw_bytes,
             ours=rotate([lambda x=x, s=s, g=g, i=i: torch.ops.baracuda.fractional_max_pool_backward(
                 g, i, s, list(x.shape), kern, "torch") for x, s, g, i in sets]),
             peer=rotate([lambda x=x, s=s, g=g, i=i: torch_bw(g, x, kern, list(out_size), i)
                          for x, s, g, i in sets]),
             peer_name="torch backward (atomics)"),
    ]


def cases(device, quick=False):
    shapes = QUICK if quick else SHAPES
    out = []
    for dims in (2, 3):
        shape, kernel, out_size = shapes[dims]
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            out += _cases(device, dims, dtype, shape, kernel, out_size)
    return out
