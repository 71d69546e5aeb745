"""One timer for the main job and the benchmarks.

CUDA: events around each call, after warm-up, median over repetitions -- the
device time of the call including any launch gap the host leaves. CPU:
``time.perf_counter`` around each call. Callers that must not measure a warm
cache pass a ``fn`` that rotates among several input sets.
"""

import statistics
import time
from typing import Callable

import torch


def median_us(fn: Callable[[], object], device: torch.device, *, warmup: int = 5,
              reps: int = 30) -> float:
    """Median time of one ``fn()`` call, in microseconds."""
    for _ in range(warmup):
        fn()
    samples = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
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
