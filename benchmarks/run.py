"""Benchmark runner: one markdown table for every op family.

    python benchmarks/run.py [--family write_slice] [--out FILE.md] [--quick]

Each family is a module ``bench_<family>.py`` next to this file whose
``cases(device, quick)`` returns a list of ``common.Case``. Ours and the peer
are timed with the shared timer (``baracuda_torch._timing``), the one the main
job uses, so the numbers here and there agree. The roofline is the device's
own copy bandwidth, measured first, so "% of roofline" says how close a write
comes to a plain memcpy of the same bytes.
"""

import argparse
import datetime
import glob
import importlib
import os
import platform
import statistics
import subprocess
import sys

import torch

import baracuda_torch  # noqa: F401  (registers torch.ops.baracuda)
from baracuda_torch._timing import graph_replay_us, median_us

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the family modules import `common` from here
from common import n_sets, rotate  # noqa: E402  (found through the path above)

COLUMNS = ["family", "case", "dtype", "ours µs", "peer", "peer µs", "speedup (peer/ours)",
           "ours GB/s", "peer GB/s", "% of copy roofline", "% of same-bytes copy"]


def copy_roofline_gbs(device, quick):
    """Bytes read + written per second by one large ``copy_``. 1 GiB on CUDA,
    far beyond L2, so this is DRAM bandwidth as a copy kernel sees it."""
    n = (64 << 20) if quick else (1 << 30 if device.type == "cuda" else 256 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    us = median_us(lambda: dst.copy_(src), device, warmup=3, reps=20)
    return 2 * n / us / 1e3


def same_bytes_copy_us(bytes_moved, device, reps, cache):
    """Median µs of a device ``copy_`` that reads bytes_moved / 2 and writes
    as many, rotated over cold sets as the cases are; one timing per size."""
    if bytes_moved not in cache:
        half = max(bytes_moved // 2, 1)
        pairs = [(torch.empty(half, dtype=torch.uint8, device=device),
                  torch.empty(half, dtype=torch.uint8, device=device))
                 for _ in range(n_sets(bytes_moved))]
        copies = rotate([lambda s=s, d=d: d.copy_(s) for s, d in pairs])
        cache[bytes_moved] = median_us(copies, device, reps=reps, device_only=True)
    return cache[bytes_moved]


def header(device, roofline, quick):
    if device.type == "cuda":
        cap = "%d.%d" % torch.cuda.get_device_capability(device)
        dev = f"{torch.cuda.get_device_name(device)} (compute capability {cap})"
    else:
        dev = f"CPU ({platform.processor() or platform.machine()})"
    try:
        commit = subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"],
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [
        f"## {now}{' (--quick: small sizes, smoke test only)' if quick else ''}",
        "",
        f"- device: {dev}",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda}, commit {commit}",
        f"- copy roofline: {roofline:.1f} GB/s (bytes read + written per second by one "
        f"large `copy_`)",
        "- % of same-bytes copy (where given): ours against a `copy_` of the case's own "
        "minimal bytes, timed the same way",
    ]


ROUNDS = 5


def time_case(case, device, with_peer=True):
    """(ours µs, peer µs or None). Graph cases: per call inside a replayed graph.

    Ours and the peer are timed in alternating rounds and each reports the
    median of its rounds: host-bound cases (a decode append is mostly launch
    overhead) drift with the machine, and alternating keeps that drift from
    landing on one side only. ``with_peer=False`` times ours alone."""
    if case.graph:
        timer = lambda fn: graph_replay_us(fn, device)  # noqa: E731
    else:
        timer = lambda fn: median_us(fn, device, reps=case.reps,  # noqa: E731
                                     device_only=case.device_only)
    ours, peer = [], []
    for _ in range(ROUNDS):
        ours.append(timer(case.ours))
        if with_peer and case.peer is not None:
            peer.append(timer(case.peer))
    return statistics.median(ours), statistics.median(peer) if peer else None


def fmt(x, spec):
    return "" if x is None else format(x, spec)


def run_family(family, device, quick, roofline, notes, case_filter=None):
    mod = importlib.import_module(f"bench_{family}")
    rows, copies = [], {}
    for case in mod.cases(device, quick):
        if case_filter and case_filter not in case.name:
            continue
        name = case.name
        if case.note:
            notes.append(case.note)
            name += f" [{len(notes)}]"
        try:
            ours, peer = time_case(case, device)
        except Exception as e:  # one broken case must not hide the rest of the table
            notes.append(f"{case.name}: failed: {type(e).__name__}: {e}".splitlines()[0])
            rows.append([family, f"{name} [{len(notes)}]", case.dtype] + [""] * 8)
            continue
        speed = [fmt(peer / ours if peer else None, ".2f") + ("×" if peer else "")]
        if case.flops:
            tflops = lambda us: f"{case.flops / us / 1e6:.1f} TFLOP/s"  # noqa: E731
            speed += [tflops(ours), tflops(peer) if peer else "", ""]
        else:
            gbs = lambda us: case.bytes_moved / us / 1e3  # noqa: E731
            speed += [fmt(gbs(ours), ".1f"), fmt(gbs(peer) if peer else None, ".1f"),
                      fmt(100 * gbs(ours) / roofline, ".1f")]
        copy_us = (same_bytes_copy_us(case.bytes_moved, device, case.reps, copies)
                   if case.same_bytes_copy and not case.flops else None)
        speed.append(fmt(100 * copy_us / ours if copy_us else None, ".1f"))
        rows.append([family, name, case.dtype, fmt(ours, ".2f"), case.peer_name, fmt(peer, ".2f")] + speed)
    return rows


def markdown_table(rows):
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def main():
    families = sorted(os.path.basename(p)[len("bench_"):-len(".py")]
                      for p in glob.glob(os.path.join(HERE, "bench_*.py")))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", choices=families,
                    help="only this family (repeatable; default: all)")
    ap.add_argument("--out", help="also write the markdown (header + table) here")
    ap.add_argument("--case", help="only the cases whose name contains this text")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test, runs on CPU")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)

    roofline = copy_roofline_gbs(device, args.quick)
    rows, notes = [], []
    for family in args.family or families:
        rows += run_family(family, device, args.quick, roofline, notes, args.case)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the next family's sets get the memory

    lines = header(device, roofline, args.quick) + [""] + markdown_table(rows)
    if notes:
        lines += [""] + [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
