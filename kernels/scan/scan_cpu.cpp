// Host engine of the scan family: a sequential walk along the axis, with one
// running state per inner column so memory is read in order. It runs the
// same functors as the CUDA engine (scan_ops.h), for float32 and float64
// (accumulated in double).
#include <vector>

#include "scan/scan_dispatch.h"
#include "scan/scan_kernels.h"

namespace baracuda {
namespace {

template <typename Op>
void scan_lines(const Op& op, const ScanShape& s, bool reverse) {
  using State = typename Op::State;
  std::vector<State> carry(static_cast<size_t>(s.inner));
  for (int64_t o = 0; o < s.outer; ++o) {
    for (auto& c : carry) c = op.identity();
    for (int64_t p = 0; p < s.len; ++p) {
      const int64_t l = reverse ? s.len - 1 - p : p;
      const int64_t base = (o * s.len + l) * s.inner;
      for (int64_t i = 0; i < s.inner; ++i) {
        carry[i] = op.combine(carry[i], op.load(base + i, l));
        op.store(base + i, l, carry[i]);
      }
    }
  }
}

template <typename Args>
KernelStatus run_host(const Args& a) {
  if (a.shape.numel() == 0) return KernelStatus::ok();
  return scan::dispatch_scan<void, void, double>(a, [&](const auto& op, bool reverse) {
    scan_lines(op, a.shape, reverse);
    return KernelStatus::ok();
  });
}

}  // namespace

KernelStatus scan_forward_cpu(const ScanForwardArgs& args) { return run_host(args); }
KernelStatus scan_backward_cpu(const ScanBackwardArgs& args) { return run_host(args); }

}  // namespace baracuda
