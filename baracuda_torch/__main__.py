"""The main job: ``python -m baracuda_torch``.

Reports how the extension was built and what this machine has, then runs
every op family on every available device against its torch reference and
prints one table (op, device, dtype, max error, our time, the torch peer's
time). Exits non-zero if any result is off its reference. ``--family`` and
``--device`` narrow the run; ``--help`` lists them.
"""

import argparse
import sys

import torch

import baracuda_torch  # noqa: F401  (registers the ops)

from ._timing import median_us
from .selfcheck import families, max_abs_error


def compiled_backends():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return [key for key in ("CPU", "CUDA") if has("baracuda::write_slice_", key)]


def report_build():
    print("baracuda_torch build")
    print(f"  backends compiled : {', '.join(compiled_backends())}")
    print(f"  torch             : {torch.__version__} (CUDA {torch.version.cuda})")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        print(f"  device            : {props.name}, {props.multi_processor_count} SMs, "
              f"sm_{props.major}{props.minor}")
    else:
        print("  device            : no CUDA device; CPU only")
    print()


def devices():
    out = [torch.device("cpu")]
    if torch.cuda.is_available() and "CUDA" in compiled_backends():
        out.append(torch.device("cuda"))
    return out


def family_name(family) -> str:
    return family.__name__.rsplit(".", 1)[-1]


def _choices(values, known, what):
    """The entries of repeated / comma-separated ``values`` (all of ``known``
    when none were given), each checked against ``known``."""
    picked = [v.strip() for vs in (values or []) for v in vs.split(",") if v.strip()]
    unknown = sorted(set(picked) - set(known))
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(known)})")
    return [k for k in known if k in picked] if picked else list(known)


def parse_args(argv):
    names = [family_name(f) for f in families()]
    parser = argparse.ArgumentParser(
        prog="python -m baracuda_torch",
        description="Check each op family against its torch reference on each device and "
                    "time it beside its torch peer; exits non-zero if a result is off.")
    parser.add_argument("--family", action="append", metavar="NAME",
                        help=f"family to run, repeatable or comma-separated: {', '.join(names)} "
                             "(default: all)")
    parser.add_argument("--device", action="append", metavar="DEV",
                        help="device to run on, repeatable or comma-separated: cpu, cuda "
                             "(default: cpu, and cuda when a GPU and the CUDA kernels are there)")
    args = parser.parse_args(argv)
    args.family = _choices(args.family, names, "family")
    available = [d.type for d in devices()]
    if args.device:
        args.device = _choices(args.device, ["cpu", "cuda"], "device")
        missing = [d for d in args.device if d not in available]
        if missing:
            raise SystemExit(f"device not available here: {', '.join(missing)} "
                             f"(available: {', '.join(available)})")
    else:
        args.device = available
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    report_build()
    header = ("op", "device", "dtype", "shape", "max err", "ours µs", "torch µs", "ok")
    rows = []
    failures = 0
    for device in map(torch.device, args.device):
        for family in (f for f in families() if family_name(f) in args.family):
            for check in family.checks(device):
                ours = check.run_ours()
                err = max_abs_error(ours, check.run_reference())
                ok = err <= check.tolerance
                failures += not ok
                t_ours = median_us(check.run_ours, device)
                t_peer = median_us(check.run_peer, device)
                rows.append((check.op, device.type, str(check.dtype).replace("torch.", ""),
                             check.shape, f"{err:.3g}", f"{t_ours:.1f}", f"{t_peer:.1f}",
                             "yes" if ok else "NO"))
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    print(f"\nmain job: {len(rows) - failures} of {len(rows)} results match their references")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
