// The CUDA scans' part for forward scans of float32 data (scan_cuda_parts.h).
#include "scan/scan_launch.cuh"

namespace baracuda {
namespace scan {

template KernelStatus scan_cuda<float>(const ScanForwardArgs&, void*);
template ScanKernel scan_kernel_cuda<float>(const ScanForwardArgs&);

}  // namespace scan
}  // namespace baracuda
