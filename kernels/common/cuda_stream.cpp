// Built only with CUDA: the one op-layer file that includes torch's CUDA headers.
#include <ATen/cuda/CUDAContext.h>

#include "common/torch_glue.h"

namespace baracuda {

void* current_cuda_stream(const at::Tensor& t) {
  return static_cast<void*>(at::cuda::getCurrentCUDAStream(t.device().index()).stream());
}

}  // namespace baracuda
