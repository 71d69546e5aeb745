// The op layer's side of the launcher contract: turning a KernelStatus into a
// torch error, finding the stream to launch on, and memory-overlap checks
// that several families need. Included only by op-layer .cpp files.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>

#include "common/float_dtype.h"
#include "common/status.h"

namespace baracuda {

// Raises "baracuda::<op>: <what> failed: <detail>" unless the status is ok.
void check_status(const KernelStatus& status, const char* op, const char* what);

// The kernels' dtype of tensor `name`, or "baracuda::<op>: <name>.dtype=... is
// not supported" for anything but float16, bfloat16, float32 and float64.
FloatDtype float_dtype_of(const char* op, const char* name, const at::Tensor& t);
// The same for a dtype that tensor `name` would have.
FloatDtype float_dtype_of(const char* op, const char* name, at::ScalarType t);

// A CUDA launcher's address in CUDA builds, nullptr otherwise, so that CPU
// builds never reference the CUDA symbols.
#ifdef BARACUDA_WITH_CUDA
#define BARACUDA_CUDA_ONLY(fn) (fn)
#else
#define BARACUDA_CUDA_ONLY(fn) nullptr
#endif

// An uninitialised contiguous tensor on `options`' device (CPU or CUDA),
// allocated as torch's own kernels allocate their outputs: straight from the
// device's allocator, without a trip through the dispatcher, which costs
// about a microsecond of host time per tensor on small calls.
at::Tensor new_empty(at::IntArrayRef sizes, const at::TensorOptions& options);

// new_empty's CUDA side, in cuda_stream.cpp (CUDA builds only).
at::Tensor new_empty_cuda(at::IntArrayRef sizes, const at::TensorOptions& options);

// The current CUDA stream of `t`'s device, as a cudaStream_t in a void*.
// Defined (in cuda_stream.cpp) only in CUDA builds; call it under
// BARACUDA_WITH_CUDA.
void* current_cuda_stream(const at::Tensor& t);

// Runs a launcher on the device of `device_ref`: the host kernel on CPU, the
// CUDA one (on the current stream, under a device guard) otherwise.
template <typename Args>
void run_on_device(const char* op, const char* what, const Args& a, const at::Tensor& device_ref,
                   KernelStatus (*on_cpu)(const Args&),
                   KernelStatus (*on_cuda)(const Args&, void*)) {
  if (device_ref.is_cpu()) return check_status(on_cpu(a), op, what);
#ifdef BARACUDA_WITH_CUDA
  const c10::DeviceGuard guard(device_ref.device());
  check_status(on_cuda(a, current_cuda_stream(device_ref)), op, what);
#else
  (void)on_cuda;
  TORCH_CHECK(false, "baracuda::", op, ": built without CUDA kernels; got ", device_ref.device());
#endif
}

// A range of storage elements [first, last] a tensor view can touch.
struct StorageSpan {
  int64_t first;
  int64_t last;
};

// Span of a view with the given storage offset, sizes and strides (all in
// elements, strides non-negative, at least one element).
StorageSpan storage_span(int64_t storage_offset, at::IntArrayRef sizes,
                         at::IntArrayRef strides);

// True when `a` and `b` share storage and their spans intersect. Conservative:
// two interleaved views that never touch the same byte also count.
bool spans_intersect(const at::Tensor& a, const StorageSpan& a_span, const at::Tensor& b,
                     const StorageSpan& b_span);

}  // namespace baracuda
