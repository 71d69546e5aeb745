"""One timer for the main job and the benchmarks.

CUDA: events around each call, after warm-up, median over repetitions -- the
device time of the call including any launch gap the host leaves, or, with
``device_only``, of the device alone: the timed calls are queued behind a
spin kernel long enough for the host to enqueue all of them, so they run back
to back and no host gap falls between two events. CPU: ``time.perf_counter``
around each call. Callers that must not measure a warm cache pass a ``fn``
that rotates among several input sets.
"""

import statistics
import time
from typing import Callable

import torch


_SPIN_RATES = {}  # device index -> cycles of torch.cuda._sleep per microsecond


def _spin_cycles_per_us(device: torch.device) -> float:
    """Cycles of ``torch.cuda._sleep`` per microsecond on ``device``, measured once."""
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SPIN_RATES:
        cycles = 10_000_000
        torch.cuda._sleep(cycles // 10)  # first launch out of the way
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SPIN_RATES[key] = cycles / (start.elapsed_time(end) * 1e3)
    return _SPIN_RATES[key]


def median_us(fn: Callable[[], object], device: torch.device, *, warmup: int = 5,
              reps: int = 30, device_only: bool = False) -> float:
    """Median time of one ``fn()`` call, in microseconds (``device_only``: see
    the module's text)."""
    host_us = []
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        host_us.append((time.perf_counter() - t0) * 1e6)
    samples = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        if device_only:
            # Twice what a warm-up call took the host (the median: the first
            # may compile), plus a millisecond; at most half a second.
            hold_us = min(2 * reps * statistics.median(host_us) + 1000, 500_000)
            torch.cuda._sleep(int(hold_us * _spin_cycles_per_us(device)))
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        samples = [start.elapsed_time(end) * 1e3 for start, end in events]
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def graph_replay_us(fn: Callable[[], object], device: torch.device, *, calls: int = 100,
                    reps: int = 20) -> float:
    """Per-call time of ``fn`` when ``calls`` of it are captured in one CUDA
    graph and the graph is replayed (launch overhead amortised away)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return median_us(graph.replay, device, warmup=3, reps=reps) / calls
