"""Ours in two builds of this library, side by side in one run.

    python benchmarks/compare_builds.py BASE HEAD [--family scan ...]
        [--case TEXT] [--passes 3] [--quick] [--out FILE.md]

BASE and HEAD are source trees, each with its extension built in place
(``python setup.py build_ext --inplace``). torch holds one ``baracuda``
library per process, so each build is timed in a child process of its own,
the passes alternating (base, head, base, ...) so that the machine's drift
lands on both sides. Every pass times ours of each case as ``run.py`` does
(``time_case``: the case's timer, median of its rounds) with this file's
benchmark cases, whichever tree it runs; a row's figure is the median of its
passes. Prints base µs, head µs and base / head (above 1: head is faster)
for each row, then the lowest ratio and the geometric mean.
"""

import argparse
import importlib
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def child(tree, families, case_filter, quick, out):
    """Times ours of every case in `tree`'s build; writes {row: µs}."""
    sys.path[:0] = [os.path.abspath(tree), HERE]
    import torch
    import baracuda_torch._C as extension

    # An editable install elsewhere can supply the extension of a tree that
    # holds none: time only the build that lives in `tree`.
    built = os.path.abspath(extension.__file__)
    if not built.startswith(os.path.join(os.path.abspath(tree), "")):
        raise SystemExit(f"compare_builds: the extension came from {built}, not from {tree}")
    from run import time_case

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    times = {}
    for family in families:
        for case in importlib.import_module(f"bench_{family}").cases(device, quick):
            if case_filter and case_filter not in case.name:
                continue
            times[f"{family} | {case.name} | {case.dtype}"] = time_case(case, device,
                                                                       with_peer=False)[0]
        if device.type == "cuda":
            torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(times, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("head")
    ap.add_argument("--family", action="append", help="a bench_<family>.py (repeatable)")
    ap.add_argument("--case", help="only the cases whose name contains this text")
    ap.add_argument("--passes", type=int, default=3, help="passes of each build")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test, runs on CPU")
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    families = args.family or ["scan", "scan_shapes"]
    if args.child:
        child(args.child, families, args.case, args.quick, args.json)
        return

    trees = {"base": os.path.abspath(args.base), "head": os.path.abspath(args.head)}
    runs = {"base": [], "head": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.passes):
            for side in ("base", "head"):
                out = os.path.join(tmp, f"{side}{i}.json")
                cmd = [sys.executable, os.path.abspath(__file__), trees["base"], trees["head"],
                       "--child", trees[side], "--json", out]
                cmd += [f"--family={f}" for f in families]
                cmd += (["--case", args.case] if args.case else []) + (["--quick"] if args.quick else [])
                # The child finds the tree's package first; nothing else of this
                # process's path comes with it.
                env = dict(os.environ, PYTHONPATH="")
                subprocess.run(cmd, check=True, env=env, cwd=trees[side])
                with open(out) as f:
                    runs[side].append(json.load(f))
    base = {k: statistics.median(r[k] for r in runs["base"]) for k in runs["base"][0]}
    head = {k: statistics.median(r[k] for r in runs["head"]) for k in runs["head"][0]}
    rows = [k for k in base if k in head]
    if not rows:
        raise SystemExit("compare_builds: no case was timed in both builds")
    ratios = {k: base[k] / head[k] for k in rows}
    lines = ["| family | case | dtype | base µs | head µs | base / head |", "|---|---|---|---|---|---|"]
    lines += [f"| {k} | {base[k]:.2f} | {head[k]:.2f} | {ratios[k]:.3f} |" for k in rows]
    low = min(rows, key=ratios.get)
    geomean = math.exp(statistics.fmean(math.log(r) for r in ratios.values()))
    lines += ["", f"{len(rows)} rows, {args.passes} passes of each build; lowest "
              f"{ratios[low]:.3f} ({low}); geometric mean {geomean:.3f}"]
    text = "\n".join(lines) + "\n"
    if args.out:
        pathlib.Path(args.out).write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
