// The CUDA scans' part for forward scans of float16 data (scan_cuda_parts.h).
#include "scan/scan_launch.cuh"

namespace baracuda {
namespace scan {

template KernelStatus scan_cuda<__half>(const ScanForwardArgs&, void*);
template ScanKernel scan_kernel_cuda<__half>(const ScanForwardArgs&);

}  // namespace scan
}  // namespace baracuda
