"""The main job: ``python -m baracuda_torch``.

Reports how the extension was built and what this machine has, then runs
every op family on every available device against its torch reference and
prints one table (op, device, dtype, max error, our time, the torch peer's
time). Exits non-zero if any result is off its reference.
"""

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


def main() -> int:
    report_build()
    header = ("op", "device", "dtype", "shape", "max err", "ours µs", "torch µs", "ok")
    rows = []
    failures = 0
    for device in devices():
        for family in families():
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
