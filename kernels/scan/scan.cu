// Entry points of the CUDA scans: the dtype picks one of the parts that
// scan_cuda_parts.h lists, where the kernels are compiled.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/float_dtype.h"
#include "common/standing_slots.h"
#include "scan/scan_cuda_parts.h"
#include "scan/scan_kernels.h"

namespace baracuda {
namespace {

template <typename Args>
KernelStatus scan_on_device(const Args& args, void* stream) {
  return dispatch_float_dtype<__half, __nv_bfloat16>(args.dtype, [&](auto storage) {
    return scan::scan_cuda<decltype(storage)>(args, stream);
  });
}

template <typename Args>
ScanKernel kernel_on_device(const Args& args) {
  ScanKernel kernel = ScanKernel::kNone;
  dispatch_float_dtype<__half, __nv_bfloat16>(args.dtype, [&](auto storage) {
    kernel = scan::scan_kernel_cuda<decltype(storage)>(args);
    return KernelStatus::ok();
  });
  return kernel;
}

}  // namespace

KernelStatus scan_forward_cuda(const ScanForwardArgs& args, void* stream) {
  return scan_on_device(args, stream);
}
KernelStatus scan_backward_cuda(const ScanBackwardArgs& args, void* stream) {
  if (args.kind == ScanKind::kCumsum) return scan_on_device(reverse_cumsum_of(args), stream);
  return scan_on_device(args, stream);
}
ScanKernel scan_forward_kernel_cuda(const ScanForwardArgs& args) {
  return kernel_on_device(args);
}
ScanKernel scan_backward_kernel_cuda(const ScanBackwardArgs& args) {
  if (args.kind == ScanKind::kCumsum) return kernel_on_device(reverse_cumsum_of(args));
  return kernel_on_device(args);
}
int scan_standing_marks_left_cuda(void* stream, int64_t marks_left) {
  return set_standing_marks_left(static_cast<cudaStream_t>(stream),
                                 static_cast<uint64_t>(marks_left));
}

}  // namespace baracuda
