"""Float64 scans on rows of odd length (the plain long_rows kernel), device only
(CUDA only; the launcher timer has no float64).

For [2, 1048577] and [1, 8388609], each op's forward on x and its scan_backward on a random
dy, timed on its own through torch.ops.baracuda with
``baracuda_torch._timing.median_us(..., device_only=True)``:

    python tools/scan_float64_rows.py
"""

import torch

import baracuda_torch as bt
from baracuda_torch._timing import median_us


def main():
    dev = torch.device("cuda")
    ops = torch.ops.baracuda
    print("| shape | op | forward µs | backward µs |")
    print("|---|---|---|---|")
    for shape in [(2, (1 << 20) + 1), (1, (1 << 23) + 1)]:
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(shape, generator=g, device=dev, dtype=torch.float64)
        dy = torch.randn(shape, generator=g, device=dev, dtype=torch.float64)
        assert bt.scan_path(x, -1) == "long_rows"
        for kind in ("cumsum", "cumprod", "logcumsumexp", "cummax"):
            xi = 1 + x / 1024 if kind == "cumprod" else x
            out = getattr(ops, kind).default(xi, -1, False)
            y, idx = out if isinstance(out, tuple) else (out, None)
            fwd = median_us(lambda: getattr(ops, kind).default(xi, -1, False), dev,
                            device_only=True)
            bwd = median_us(lambda: ops.scan_backward.default(dy, xi, y, idx, -1, kind, False),
                            dev, device_only=True)
            print(f"| {list(shape)} | {kind} | {fwd:.2f} | {bwd:.2f} |")


if __name__ == "__main__":
    main()
