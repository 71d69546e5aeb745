// The CUDA scans come in eight parts, one per storage type and direction
// (scan_<direction>_<dtype>.cu), so that they compile in parallel: each part
// instantiates scan_cuda for its pair from scan_launch.cuh, and the entry
// points (scan.cu) pick the part by dtype. No torch headers.
#pragma once

#include "common/status.h"
#include "scan/scan_kernels.h"

namespace baracuda {
namespace scan {

// Runs the scan of `args` (ScanForwardArgs or ScanBackwardArgs) on data of
// storage type T, on `stream` (a cudaStream_t).
template <typename T, typename Args>
KernelStatus scan_cuda(const Args& args, void* stream);

}  // namespace scan
}  // namespace baracuda
