// The op layer's side of the launcher contract: turning a KernelStatus into a
// torch error, finding the stream to launch on, and memory-overlap checks
// that several families need. Included only by op-layer .cpp files.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/status.h"

namespace baracuda {

// Raises "baracuda::<op>: <what> failed: <detail>" unless the status is ok.
void check_status(const KernelStatus& status, const char* op, const char* what);

// A CUDA launcher's address in CUDA builds, nullptr otherwise, so that CPU
// builds never reference the CUDA symbols.
#ifdef BARACUDA_WITH_CUDA
#define BARACUDA_CUDA_ONLY(fn) (fn)
#else
#define BARACUDA_CUDA_ONLY(fn) nullptr
#endif

// The current CUDA stream of `t`'s device, as a cudaStream_t in a void*.
// Defined (in cuda_stream.cpp) only in CUDA builds; call it under
// BARACUDA_WITH_CUDA.
void* current_cuda_stream(const at::Tensor& t);

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
