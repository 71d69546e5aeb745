// The CUDA scans' part for forward scans of bfloat16 data (scan_cuda_parts.h).
#include "scan/scan_launch.cuh"

namespace baracuda {
namespace scan {

template KernelStatus scan_cuda<__nv_bfloat16>(const ScanForwardArgs&, void*);

}  // namespace scan
}  // namespace baracuda
