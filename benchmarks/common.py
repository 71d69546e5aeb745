"""What a benchmark family hands the runner: a list of Case.

Each family lives in ``benchmarks/bench_<family>.py`` and exposes
``cases(device, quick) -> list[Case]``. The runner times ``ours`` and ``peer``
with the shared timer, so every family is measured the same way.
"""

import itertools
import math
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

# Bytes of distinct data a timed loop must cycle through so that H100's 50 MB
# L2 cannot serve repeats: four times its size.
COLD_BYTES = 200e6


@dataclass
class Case:
    name: str
    dtype: str
    bytes_moved: int            # minimal traffic: read the source + write the window
    ours: Callable[[], object]
    peer: Optional[Callable[[], object]] = None   # None: no natural counterpart
    peer_name: str = ""
    graph: bool = False         # time per call inside a replayed CUDA graph
    note: str = ""              # footnote printed under the table
    reps: int = 50
    # Time the device alone (calls queued behind a spin, _timing.py) where the
    # target is a bandwidth: a host slower than the kernel must not count.
    device_only: bool = False
    # Compute-bound ops: matmul FLOPs per call. When set, the throughput columns
    # read TFLOP/s (of ours and of the peer doing the same useful work).
    flops: float = 0.0
    # Also time a device copy of bytes_moved (half read, half written), cold
    # and on the same timer, and give ours as a percentage of its rate: a
    # copy of a few tens of MB runs below the 1 GiB roofline's rate.
    same_bytes_copy: bool = False


def n_sets(touched_bytes: int, cap: int = 8) -> int:
    """How many distinct input sets a bulk case rotates through: enough that
    they total more than COLD_BYTES, at least 2 (so no call sees the previous
    call's lines), at most ``cap`` (memory)."""
    return max(2, min(cap, math.ceil(COLD_BYTES / max(touched_bytes, 1))))


def rotate(fns: List[Callable[[], object]]) -> Callable[[], object]:
    """One callable that calls ``fns[0]``, ``fns[1]``, ... in turn."""
    it = itertools.cycle(fns)
    return lambda: next(it)()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
