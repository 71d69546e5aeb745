// The CUDA scans' part for backward scans of float32 data (scan_cuda_parts.h).
#include "scan/scan_launch.cuh"

namespace baracuda {
namespace scan {

template KernelStatus scan_cuda<float>(const ScanBackwardArgs&, void*);
template ScanKernel scan_kernel_cuda<float>(const ScanBackwardArgs&);

}  // namespace scan
}  // namespace baracuda
