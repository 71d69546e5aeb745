// The CUDA scans come in eight parts, one per storage type and direction
// (scan_<direction>_<dtype>.cu), so that they compile in parallel: each part
// instantiates scan_cuda for its pair from scan_launch.cuh, and the entry
// points (scan.cu) pick the part by dtype. No torch headers.
#pragma once

#include "common/status.h"
#include "scan/scan_kernels.h"
#include "scan/scan_plan.h"

namespace baracuda {
namespace scan {

// Runs the scan of `args` (ScanForwardArgs or ScanBackwardArgs) on data of
// storage type T, on `stream` (a cudaStream_t).
template <typename T, typename Args>
KernelStatus scan_cuda(const Args& args, void* stream);

// The kernel scan_cuda would launch for `args` on the current device (its
// pointers are read for their alignment only).
template <typename T, typename Args>
ScanKernel scan_kernel_cuda(const Args& args);

}  // namespace scan
}  // namespace baracuda
