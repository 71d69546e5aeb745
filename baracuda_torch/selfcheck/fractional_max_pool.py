"""Main-job rows of the fractional max pooling family: torch's own op with the
same samples is the exact reference (the windows are PyTorch's), and the
peer that is timed."""

import torch
import torch.nn.functional as F

import baracuda_torch as bt

from . import Check


def _case(device, dtype, shape, kernel, out_size):
    dims = len(out_size)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, generator=g, device=device).to(dtype)
    s = torch.rand(shape[0], shape[1], dims, generator=g, device=device).to(dtype)
    ours_fn, torch_fn = ((bt.fractional_max_pool2d, F.fractional_max_pool2d) if dims == 2
                         else (bt.fractional_max_pool3d, F.fractional_max_pool3d))
    ours = lambda: ours_fn(x, kernel, out_size, _random_samples=s)  # noqa: E731
    ref = lambda: torch_fn(x, kernel, out_size, _random_samples=s)  # noqa: E731
    return Check(f"fractional_max_pool{dims}d", dtype, "x".join(map(str, shape)), ours, ref, ref)


def checks(device):
    big = device.type == "cuda"
    return [
        _case(device, torch.float32, (32, 64, 112, 112) if big else (4, 8, 56, 56), 3,
              (56, 56) if big else (28, 28)),
        _case(device, torch.bfloat16, (8, 16, 57, 61), 3, (27, 30)),
        _case(device, torch.float32, (8, 32, 32, 64, 64) if big else (2, 4, 16, 20, 18), 2,
              (16, 32, 32) if big else (8, 10, 9)),
    ]
