"""baracuda_torch: bespoke CUDA kernels for PyTorch, as torch.ops.baracuda ops.

Importing the package loads the compiled library (which registers every op
in ``torch.ops.baracuda``) and the Python side of each family: the public
functions, their fake kernels for torch.compile, and their autograd formulas.
"""

import torch  # noqa: F401  (must be loaded before the extension)

from . import _C  # noqa: F401  (registers torch.ops.baracuda.*)
from ._version import __version__
from . import masks, nn  # noqa: F401
from .block_sparse_attention import (attention_flops, block_sparse_attention,
                                     block_sparse_attention_path)
from .fractional_max_pool import fractional_max_pool2d, fractional_max_pool3d
from .linear_scan import linear_scan
from .merge import merge_state, merge_state_, merge_states
from .scan import cummax, cummin, cumprod, cumsum, logcumsumexp, scan_path
from .write_slice import write_slice, write_slice_, write_slice_at_, write_slice_path

__all__ = [
    "__version__",
    "attention_flops",
    "block_sparse_attention",
    "block_sparse_attention_path",
    "cummax",
    "cummin",
    "cumprod",
    "cumsum",
    "fractional_max_pool2d",
    "fractional_max_pool3d",
    "linear_scan",
    "logcumsumexp",
    "masks",
    "merge_state",
    "merge_state_",
    "merge_states",
    "nn",
    "scan_path",
    "write_slice",
    "write_slice_",
    "write_slice_at_",
    "write_slice_path",
]
