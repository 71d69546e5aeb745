"""The host's cost to queue one small scan, beside torch calls of known content (CUDA only).

Each call below is queued 400 times without a sync and the host time divided by 400 (the
device keeps up with calls this small); rounds alternate the calls, 15 rounds, median and
minimum. torch.neg is an allocation and a launch, z.neg_() a launch alone,
ops.scan_path.default a baracuda op that launches nothing:

    python tools/scan_host_parts.py
"""

import statistics
import time

import torch

import baracuda_torch as bt


def per_call_us(fn, calls=400):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return us


def main():
    dev = torch.device("cuda")
    ops = torch.ops.baracuda
    x = torch.randn(32, 128, device=dev)
    z = torch.randn(32, 128, device=dev)
    xs = torch.randn(4096, 96, device=dev)
    calls = {
        "torch.cumsum": lambda: torch.cumsum(x, -1),
        "bt.cumsum": lambda: bt.cumsum(x, -1),
        "ops.cumsum.default": lambda: ops.cumsum.default(x, -1, False),
        "torch.neg (alloc+launch)": lambda: torch.neg(x),
        "z.neg_() (launch)": lambda: z.neg_(),
        "torch.empty_like": lambda: torch.empty_like(x),
        "ops.scan_path.default": lambda: ops.scan_path.default(x, -1),
        "torch.cummax": lambda: torch.cummax(x, -1),
        "bt.cummax": lambda: bt.cummax(x, -1),
        "torch.cumsum [4096,96] d0": lambda: torch.cumsum(xs, 0),
        "bt.cumsum [4096,96] d0": lambda: bt.cumsum(xs, 0),
    }
    for fn in calls.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    times = {k: [] for k in calls}
    for _ in range(15):
        for k, fn in calls.items():
            times[k].append(per_call_us(fn))
    with torch.inference_mode():
        xi = torch.randn(32, 128, device=dev)
        for name, fn in [("inference_mode ops.cumsum.default",
                          lambda: ops.cumsum.default(xi, -1, False)),
                         ("inference_mode torch.cumsum", lambda: torch.cumsum(xi, -1))]:
            for _ in range(200):
                fn()
            times[name] = [per_call_us(fn) for _ in range(15)]
    print("| call | host µs a call, median of 15 rounds of 400 | min |")
    print("|---|---|---|")
    for k, v in times.items():
        print(f"| {k} | {statistics.median(v):.2f} | {min(v):.2f} |")


if __name__ == "__main__":
    main()
