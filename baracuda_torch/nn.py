"""``torch.nn`` modules over baracuda_torch's ops, with torch.nn's
constructor arguments."""

import torch

from .fractional_max_pool import (check_size_arguments, fractional_max_pool2d,
                                  fractional_max_pool3d)


class _FractionalMaxPoolNd(torch.nn.Module):
    dims = 2

    def __init__(self, kernel_size, output_size=None, output_ratio=None, return_indices=False,
                 _random_samples=None, *, placement="torch"):
        super().__init__()
        check_size_arguments(f"FractionalMaxPool{self.dims}d", self.dims, output_size,
                             output_ratio)
        self.kernel_size = kernel_size
        self.output_size = output_size
        self.output_ratio = output_ratio
        self.return_indices = return_indices
        self.placement = placement
        self.register_buffer("_random_samples", _random_samples)

    def forward(self, x):
        return self._pool(x, self.kernel_size, self.output_size, self.output_ratio,
                          self.return_indices, self._random_samples, placement=self.placement)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, output_size={self.output_size}, "
                f"output_ratio={self.output_ratio}, placement={self.placement!r}")


class FractionalMaxPool2d(_FractionalMaxPoolNd):
    """Drop-in for ``torch.nn.FractionalMaxPool2d`` (plus ``placement``)."""

    dims = 2
    _pool = staticmethod(fractional_max_pool2d)


class FractionalMaxPool3d(_FractionalMaxPoolNd):
    """Drop-in for ``torch.nn.FractionalMaxPool3d`` (plus ``placement``)."""

    dims = 3
    _pool = staticmethod(fractional_max_pool3d)
