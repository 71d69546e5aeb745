// What the scan ops' host layers share (scan_op.cpp, linear_scan_op.cpp):
// the [outer, len, inner] view, the host upcast of half types, the CUDA
// workspace, the host engine spread over torch's threads, and the fields
// every launch shares.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <mutex>

#include "common/torch_glue.h"
#include "scan/scan_kernels.h"
#include "scan/scan_plan.h"

namespace baracuda {
namespace scan_op {

// The scan axis of `x` and the [outer, len, inner] view around it. A 0-d
// tensor scans as one element along dim 0 / -1, as in torch.
inline ScanShape scan_shape(const char* op, const at::Tensor& x, int64_t dim) {
  TORCH_CHECK(x.layout() == at::kStrided, "baracuda::", op, ": x must be a strided tensor");
  const int64_t rank = x.dim();
  const int64_t span = rank == 0 ? 1 : rank;
  TORCH_CHECK(dim >= -span && dim < span, "baracuda::", op, ": dim=", dim,
              " out of range for a rank-", rank, " tensor");
  ScanShape s;
  if (rank == 0) {
    s.len = 1;
    return s;
  }
  const int64_t d = dim < 0 ? dim + rank : dim;
  for (int64_t k = 0; k < d; ++k) s.outer *= x.size(k);
  s.len = x.size(d);
  for (int64_t k = d + 1; k < rank; ++k) s.inner *= x.size(k);
  return s;
}

// dim within [0, rank) (0 for a 0-d tensor), for a dim scan_shape accepted.
inline int64_t scan_axis(const at::Tensor& t, int64_t dim) {
  return t.dim() == 0 ? 0 : (dim < 0 ? dim + t.dim() : dim);
}

// The slice of `t` at the scan position a scan along dim starts from (its
// last with reverse); t itself when 0-d. Symbolic sizes stay symbolic.
inline at::Tensor first_slice(const at::Tensor& t, int64_t dim, bool reverse) {
  if (t.dim() == 0) return t;
  const int64_t d = scan_axis(t, dim);
  return reverse ? t.select_symint(d, t.sym_size(d) - 1) : t.select(d, 0);
}

// Host kernels take float32 / float64: half types are computed in float32.
inline bool needs_host_upcast(const at::Tensor& t) {
  return t.is_cpu() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16);
}

inline at::Tensor host_compute(const at::Tensor& t) {
  return needs_host_upcast(t) ? t.to(at::kFloat).contiguous() : t.contiguous();
}

// A scan's workspace, allocated on its device when the launch asks for it
// (ScanWorkspace) and kept until the op returns, after the launch is queued.
struct WorkspaceOwner {
  at::TensorOptions options;
  at::Tensor bytes;
};

inline void* allocate_workspace(void* owner, int64_t bytes) {
  auto* w = static_cast<WorkspaceOwner*>(owner);
  w->bytes = new_empty({bytes}, w->options.dtype(at::kByte));
  return w->bytes.data_ptr();
}

inline ScanWorkspace workspace_for(const ScanShape& s, WorkspaceOwner& owner) {
  ScanWorkspace w;
  if (owner.options.device().is_cpu()) return w;
  w.allocate = &allocate_workspace;
  w.owner = &owner;
  w.bytes = scan_workspace_bytes(s);
  return w;
}

// The host engine's lines spread over torch's intra-op threads, in runs of
// consecutive lines (whole rows, or neighbouring columns) of at least
// kHostTaskElements elements, so that small scans stay on one thread. Each
// line is scanned whole by one thread: results do not depend on the thread
// count.
inline constexpr int64_t kHostTaskElements = int64_t(1) << 15;

template <typename Args>
KernelStatus scan_on_host_threads(const Args& a,
                                  KernelStatus (*scan_lines)(const Args&, int64_t, int64_t)) {
  const int64_t lines = a.shape.outer * a.shape.inner;
  const int64_t grain = std::max<int64_t>(1, kHostTaskElements / std::max<int64_t>(a.shape.len, 1));
  std::mutex failure_mutex;
  KernelStatus failure = KernelStatus::ok();
  at::parallel_for(0, lines, grain, [&](int64_t first, int64_t last) {
    const KernelStatus st = scan_lines(a, first, last);
    if (st.is_ok()) return;
    const std::lock_guard<std::mutex> lock(failure_mutex);
    if (failure.is_ok()) failure = st;
  });
  return failure;
}

inline KernelStatus scan_forward_host(const ScanForwardArgs& a) {
  return scan_on_host_threads(a, &scan_forward_cpu_lines);
}

inline KernelStatus scan_backward_host(const ScanBackwardArgs& a) {
  return scan_on_host_threads(a, &scan_backward_cpu_lines);
}

// The fields every launch shares.
template <typename Args>
Args launch_args(ScanKind kind, const char* op, const at::Tensor& data, const ScanShape& s,
                 bool reverse, WorkspaceOwner& workspace) {
  Args a;
  a.kind = kind;
  a.dtype = float_dtype_of(op, "x", data);
  a.shape = s;
  a.reverse = reverse;
  a.workspace = workspace_for(s, workspace);
  return a;
}

}  // namespace scan_op
}  // namespace baracuda
