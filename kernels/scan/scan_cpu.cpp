// Host engine of the scan family: a sequential walk along the axis, with one
// running state per inner column so memory is read in order. It runs the
// same functors as the CUDA engines (scan_ops.h), for float32 and float64
// (accumulated in double), and those of the integer scans
// (scan_integer_ops.h). It scans a range of lines (scan_kernels.h), so that
// the op layer can spread them over threads.
#include <algorithm>
#include <vector>

#include "scan/scan_dispatch.h"
#include "scan/scan_integer_ops.h"
#include "scan/scan_kernels.h"

namespace baracuda {
namespace {

// One line (inner == 1, or a lone column): the running state stays in a
// local, where a store through the op's output pointer, which may alias any
// memory as far as the compiler knows, cannot force it back to memory.
template <typename Op>
void scan_one_line(const Op& op, const ScanShape& s, bool reverse, int64_t o, int64_t i) {
  typename Op::State carry = op.identity();
  for (int64_t p = 0; p < s.len; ++p) {
    const int64_t l = reverse ? s.len - 1 - p : p;
    const int64_t off = (o * s.len + l) * s.inner + i;
    carry = op.combine(carry, op.load(off, l));
    op.store(off, l, carry);
  }
}

// Lines [first, last), line o * inner + i: for each outer index they touch,
// the columns [begin, end) walk the axis side by side.
template <typename Op>
void scan_lines(const Op& op, const ScanShape& s, bool reverse, int64_t first, int64_t last) {
  using State = typename Op::State;
  std::vector<State> carry;
  for (int64_t o = first / s.inner; o * s.inner < last; ++o) {
    const int64_t begin = std::max<int64_t>(first - o * s.inner, 0);
    const int64_t end = std::min<int64_t>(last - o * s.inner, s.inner);
    if (end - begin == 1) {
      scan_one_line(op, s, reverse, o, begin);
      continue;
    }
    carry.assign(static_cast<size_t>(end - begin), op.identity());
    for (int64_t p = 0; p < s.len; ++p) {
      const int64_t l = reverse ? s.len - 1 - p : p;
      const int64_t base = (o * s.len + l) * s.inner;
      for (int64_t i = begin; i < end; ++i) {
        State& c = carry[static_cast<size_t>(i - begin)];
        c = op.combine(c, op.load(base + i, l));
        op.store(base + i, l, c);
      }
    }
  }
}

// Lines [first, last) of `a`, with the functor dispatch_functor(a, run)
// picks for it.
template <typename Args, typename DispatchFunctor>
KernelStatus run_host(const Args& a, int64_t first, int64_t last,
                      DispatchFunctor dispatch_functor) {
  if (a.shape.numel() == 0 || first >= last) return KernelStatus::ok();
  return dispatch_functor(a, [&](const auto& op, bool reverse) {
    scan_lines(op, a.shape, reverse, first, last);
    return KernelStatus::ok();
  });
}

template <typename Args>
KernelStatus run_host(const Args& a, int64_t first, int64_t last) {
  return run_host(a, first, last, [](const Args& args, auto&& run) {
    return scan::dispatch_scan<void, void, double>(args, run);
  });
}

int64_t all_lines(const ScanShape& s) { return s.outer * s.inner; }

}  // namespace

KernelStatus scan_forward_cpu_lines(const ScanForwardArgs& args, int64_t first, int64_t last) {
  return run_host(args, first, last);
}
KernelStatus scan_backward_cpu_lines(const ScanBackwardArgs& args, int64_t first, int64_t last) {
  if (args.kind == ScanKind::kCumsum) return run_host(reverse_cumsum_of(args), first, last);
  return run_host(args, first, last);
}
KernelStatus scan_integer_cpu_lines(const IntegerScanArgs& args, int64_t first, int64_t last) {
  return run_host(args, first, last, [](const IntegerScanArgs& a, auto&& run) {
    return scan::dispatch_integer_scan(a, run);
  });
}
KernelStatus scan_forward_cpu(const ScanForwardArgs& args) {
  return run_host(args, 0, all_lines(args.shape));
}
KernelStatus scan_backward_cpu(const ScanBackwardArgs& args) {
  return scan_backward_cpu_lines(args, 0, all_lines(args.shape));
}

}  // namespace baracuda
