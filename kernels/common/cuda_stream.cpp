// Built only with CUDA: the one op-layer file that includes torch's CUDA headers
// (the current stream, the CUDA allocator).
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/EmptyTensor.h>

#include "common/torch_glue.h"

namespace baracuda {

void* current_cuda_stream(const at::Tensor& t) {
  return static_cast<void*>(at::cuda::getCurrentCUDAStream(t.device().index()).stream());
}

at::Tensor new_empty_cuda(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::detail::empty_cuda(sizes, options);
}

}  // namespace baracuda
