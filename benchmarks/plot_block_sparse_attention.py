"""Time vs sparsity of block-sparse attention, FlexAttention and dense SDPA (two backends).

    PYTHONPATH=. python benchmarks/plot_block_sparse_attention.py [--quick]
    PYTHONPATH=. python benchmarks/plot_block_sparse_attention.py --from-csv FILE [--title TEXT]

Random block masks (causal off) at several densities, bf16, B=4, H=16,
L=8192, D=128, block 128. Always writes the numbers to
``benchmarks/block_sparse_attention_sparsity.csv``; also draws
``block_sparse_attention_sparsity.png`` when matplotlib is installed.
``--from-csv`` only draws, from numbers measured earlier (on a GPU machine
without matplotlib, say).
"""

import argparse
import csv
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import baracuda_torch as bt  # noqa: E402
from baracuda_torch import masks  # noqa: E402
from baracuda_torch._timing import median_us  # noqa: E402
from bench_block_sparse_attention import dense_sdpa, flex, flex_block_mask  # noqa: E402

DENSITIES = [1.0, 0.5, 0.3, 0.2, 0.1, 0.05]


def measure(device, quick):
    B, H, L, D, bs = (1, 2, 1024, 128, 128) if quick else (4, 16, 8192, 128, 128)
    q, k, v = (torch.randn(B, H, L, D, device=device, dtype=torch.bfloat16) for _ in range(3))
    dense_us = median_us(lambda: dense_sdpa(q, k, v, False, False), device, reps=10)
    flash_us = (median_us(lambda: dense_sdpa(q, k, v, False, True), device, reps=10)
                if device.type == "cuda" else None)
    rows = []
    for density in DENSITIES:
        m = masks.random(L, L, bs, density=density, batch=B, heads=H,
                         generator=torch.Generator().manual_seed(0)).to(device)
        ours_us = median_us(lambda: bt.block_sparse_attention(q, k, v, m, block_size=bs), device, reps=10)
        flex_us = None
        if device.type == "cuda":
            bm = flex_block_mask(m, L, bs, False)
            flex_us = median_us(lambda: flex()(q, k, v, block_mask=bm), device, reps=10)
        rows.append(dict(sparsity=1 - float(m.float().mean()), ours_us=ours_us, flex_us=flex_us,
                         dense_sdpa_us=dense_us, dense_sdpa_flash_us=flash_us))
    return rows


def draw(rows, title, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [100 * float(r["sparsity"]) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [float(r["ours_us"]) / 1e3 for r in rows], "o-", label="baracuda block_sparse_attention")
    if rows[0]["flex_us"] not in (None, ""):
        ax.plot(x, [float(r["flex_us"]) / 1e3 for r in rows], "s-", label="FlexAttention (compiled)")
    ax.plot(x, [float(r["dense_sdpa_us"]) / 1e3 for r in rows], "--", label="dense SDPA, default backend")
    if rows[0].get("dense_sdpa_flash_us") not in (None, ""):
        ax.plot(x, [float(r["dense_sdpa_flash_us"]) / 1e3 for r in rows], ":",
                label="dense SDPA, flash backend")
    ax.set_xlabel("tiles off (%)")
    ax.set_ylabel("time (ms)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--from-csv", help="draw the PNG from this CSV instead of measuring")
    ap.add_argument("--title", help="plot title (default: names the device)")
    args = ap.parse_args()
    base = os.path.join(HERE, "block_sparse_attention_sparsity")
    if args.from_csv:
        with open(args.from_csv, newline="") as f:
            rows = list(csv.DictReader(f))
    else:
        rows = measure(torch.device(args.device), args.quick)
        with open(base + ".csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(open(base + ".csv").read(), end="")
    title = args.title or f"bf16 attention, random block mask, {args.device}"
    try:
        draw(rows, title, base + ".png")
    except ImportError:
        print("matplotlib not installed: wrote the CSV only")


if __name__ == "__main__":
    main()
