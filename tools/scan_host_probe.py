"""Where a small scan's time goes when the host is part of it (CUDA only).

For cumsum and cummax on a few small shapes, one per CUDA path that such
shapes take, prints: the host's cost to enqueue one call (100 calls without a
sync, median of five), the call timed host included and device only
(``baracuda_torch._timing.median_us``, as ``bench_scan_shapes.py`` times),
and torch's call host included; then ``torch.profiler``'s table of 50 calls
on two of the shapes, which names the host calls a scan makes (launches,
allocations).

    python tools/scan_host_probe.py
"""

import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import baracuda_torch as bt
from baracuda_torch._timing import median_us

CASES = [((32, 128), -1), ((4096, 96), 0), ((16, 2048, 64), 1), ((8, 4096, 3), 1),
         ((128, 1000, 7), 1), ((64, 512, 128), 1)]
OPS = {"cumsum": (bt.cumsum, torch.cumsum), "cummax": (bt.cummax, torch.cummax)}


def enqueue_us(fn, calls=100, rounds=5):
    """Host time to queue one call: the device keeps up with so few calls."""
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def main():
    dev = torch.device("cuda")
    print("| shape | dim | path | op | host enqueue µs | host included µs | device only µs "
          "| torch, host included µs |")
    print("|---|---|---|---|---|---|---|---|")
    for shape, dim in CASES:
        x = torch.randn(shape, device=dev)
        path = torch.ops.baracuda.scan_path(x, dim)
        for name, (ours, theirs) in OPS.items():
            f = lambda: ours(x, dim)  # noqa: E731
            g = lambda: theirs(x, dim)  # noqa: E731
            for _ in range(50):
                f()
            torch.cuda.synchronize()
            print(f"| {list(shape)} | {dim} | {path} | {name} | {enqueue_us(f):.1f} "
                  f"| {median_us(f, dev):.1f} | {median_us(f, dev, device_only=True):.1f} "
                  f"| {median_us(g, dev):.1f} |")
    for shape, dim in [((4096, 96), 0), ((32, 128), -1)]:
        x = torch.randn(shape, device=dev)
        for _ in range(20):
            bt.cumsum(x, dim)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                bt.cumsum(x, dim)
            torch.cuda.synchronize()
        print(f"\ncumsum {list(shape)} along dim {dim}, 50 calls under torch.profiler:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


if __name__ == "__main__":
    main()
