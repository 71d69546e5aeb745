"""Self-checks run by the main job (``python -m baracuda_torch``).

Each family module exposes ``checks(device) -> list[Check]``: one op on one
device and dtype, compared with its torch reference and timed beside its
torch peer. Add a family by adding its module to FAMILIES.
"""

import dataclasses
from typing import Callable, List

import torch


@dataclasses.dataclass
class Check:
    op: str
    dtype: torch.dtype
    shape: str
    run_ours: Callable[[], torch.Tensor]   # returns the result to compare
    run_reference: Callable[[], torch.Tensor]  # float64 / exact reference result
    run_peer: Callable[[], object]  # what a user would call instead (timed only)
    tolerance: float = 0.0  # max abs error allowed (0: bit-exact)


def max_abs_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    if ours.dtype.is_complex:
        ours, ref = torch.view_as_real(ours), torch.view_as_real(ref.to(ours.dtype))
    diff = ours.double() - ref.double()
    if diff.numel() == 0:
        return 0.0
    return float(diff.abs().nan_to_num(nan=float("inf")).max())


def families() -> List:
    from . import block_sparse_attention, fractional_max_pool, merge, scan, write_slice

    return [write_slice, merge, scan, fractional_max_pool, block_sparse_attention]
