// Launchers of the scan family (cumsum, cumprod, logcumsumexp, cummax,
// cummin and their backward passes), over raw pointers.
//
// Every tensor is contiguous and viewed as [outer, len, inner] around the
// scan axis: element (o, l, i) lives at o * len * inner + l * inner + i. The
// op layer makes its inputs contiguous (one copy at most) before calling.
#pragma once

#include <cstdint>

#include "common/float_dtype.h"
#include "common/status.h"

namespace baracuda {

enum class ScanKind : int { kCumsum, kCumprod, kLogcumsumexp, kCummax, kCummin, kLinear };
struct ScanShape {
  int64_t outer = 1;
  int64_t len = 0;
  int64_t inner = 1;
  int64_t numel() const { return outer * len * inner; }
};

// The workspace a CUDA launch may need, scan_workspace_bytes(shape) bytes,
// allocated only when a launch first asks for it (get): launches that find
// their stream's standing slots (common/standing_slots.h) never ask, and
// save the allocation. `allocate` is the op layer's (it keeps the memory
// until the launch is queued); without it, `ptr` is the workspace.
struct ScanWorkspace {
  void* (*allocate)(void* owner, int64_t bytes) = nullptr;
  void* owner = nullptr;
  int64_t bytes = 0;
  mutable void* ptr = nullptr;
  // nullptr where there is none to give.
  void* get() const {
    if (ptr == nullptr && allocate != nullptr && bytes > 0) ptr = allocate(owner, bytes);
    return ptr;
  }
  // get() in `words`; false, with `st` saying so, where there is none.
  bool take(void*& words, KernelStatus& st) const {
    words = get();
    if (words == nullptr) st = KernelStatus::invalid("scan: this shape needs a workspace");
    return words != nullptr;
  }
};

// y = scan(x) along the axis; reverse scans from the last element to the
// first. cummax / cummin also write int64 indices (original coordinates).
// kLinear (linear_scan) is the recurrence y_t = x_t y_{t-1} + b_t, y_{-1} = 0,
// reading b too.
struct ScanForwardArgs {
  ScanKind kind = ScanKind::kCumsum;
  FloatDtype dtype = FloatDtype::kFloat32;
  ScanShape shape;
  bool reverse = false;
  const void* x = nullptr;
  const void* b = nullptr;     // kLinear only
  void* y = nullptr;
  int64_t* indices = nullptr;  // cummax / cummin only
  ScanWorkspace workspace;     // CUDA only
};

// dx from dy for the forward scan described by kind / reverse. Saved tensors
// each kind reads:
//   cumsum        -
//   cumprod       x, y       dx_i = y_{i-1} * R_i (y_{-1} = 1), R the reverse
//                            linear recurrence R_i = dy_i + x_{i+1} R_{i+1}
//   logcumsumexp  x, y       dx_i = sum_{j>=i} dy_j exp(x_i - y_j), in logs
//   cummax/min    indices    dx_i = sum of dy_j over the run idx_j == i
//   linear        x, y       db_i = R_i, the same R as cumprod's; dx_i = R_i y_{i-1}
//                            (y_{-1} = 0)
struct ScanBackwardArgs {
  ScanKind kind = ScanKind::kCumsum;
  FloatDtype dtype = FloatDtype::kFloat32;
  ScanShape shape;
  bool reverse = false;  // of the forward scan
  const void* dy = nullptr;
  const void* x = nullptr;
  const void* y = nullptr;
  const int64_t* indices = nullptr;
  void* dx = nullptr;
  void* db = nullptr;  // kLinear only
  ScanWorkspace workspace;
};

// cumsum's backward is the cumsum of dy in the other direction: the entry
// points (CUDA and host) run it as that forward scan, on the forward's
// kernels, so that no kernel is compiled twice for it.
inline ScanForwardArgs reverse_cumsum_of(const ScanBackwardArgs& a) {
  ScanForwardArgs f;
  f.kind = ScanKind::kCumsum;
  f.dtype = a.dtype;
  f.shape = a.shape;
  f.reverse = !a.reverse;
  f.x = a.dy;
  f.y = a.dx;
  f.workspace = a.workspace;
  return f;
}

KernelStatus scan_forward_cuda(const ScanForwardArgs& args, void* stream);
KernelStatus scan_backward_cuda(const ScanBackwardArgs& args, void* stream);

// The kernel those would launch on the current device (scan_plan.h's
// ScanKernel); the arguments' pointers are read for their alignment only.
enum class ScanKernel : int;
ScanKernel scan_forward_kernel_cuda(const ScanForwardArgs& args);
ScanKernel scan_backward_kernel_cuda(const ScanBackwardArgs& args);

// Leaves `marks_left` (below 2^32 - 1) fresh marks to each standing slots
// buffer `stream` has on the current device, for tests of the marks' wrap
// (common/standing_slots.h); returns how many buffers it found.
int scan_standing_marks_left_cuda(void* stream, int64_t marks_left);

// Host versions for float32 and float64 (the op layer upcasts half types).
// The _lines forms scan only lines [first, last) of the shape's outer * inner
// lines (line o * inner + i is the axis at outer index o, inner index i),
// each line alone from its start, so that lines may go to different threads
// with the same results; the others scan every line.
KernelStatus scan_forward_cpu_lines(const ScanForwardArgs& args, int64_t first, int64_t last);
KernelStatus scan_backward_cpu_lines(const ScanBackwardArgs& args, int64_t first, int64_t last);
KernelStatus scan_forward_cpu(const ScanForwardArgs& args);
KernelStatus scan_backward_cpu(const ScanBackwardArgs& args);

}  // namespace baracuda
