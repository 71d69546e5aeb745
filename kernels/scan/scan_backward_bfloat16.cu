// The CUDA scans' part for backward scans of bfloat16 data (scan_cuda_parts.h).
#include "scan/scan_launch.cuh"

namespace baracuda {
namespace scan {

template KernelStatus scan_cuda<__nv_bfloat16>(const ScanBackwardArgs&, void*);
template ScanKernel scan_kernel_cuda<__nv_bfloat16>(const ScanBackwardArgs&);

}  // namespace scan
}  // namespace baracuda
