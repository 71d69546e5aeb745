// The CUDA scans' part for backward scans of float16 data (scan_cuda_parts.h).
#include "scan/scan_launch.cuh"

namespace baracuda {
namespace scan {

template KernelStatus scan_cuda<__half>(const ScanBackwardArgs&, void*);
template ScanKernel scan_kernel_cuda<__half>(const ScanBackwardArgs&);

}  // namespace scan
}  // namespace baracuda
