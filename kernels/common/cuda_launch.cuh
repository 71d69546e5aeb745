// Launch-side helpers shared by every .cu file: CUDA error -> KernelStatus,
// and the index dividers used by strided kernels. No torch headers.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/int_divider.h"
#include "common/status.h"

namespace baracuda {

inline KernelStatus to_status(cudaError_t err) {
  if (err == cudaSuccess) return KernelStatus::ok();
  return {StatusCode::kLaunchFailed, cudaGetErrorString(err)};
}

// Call right after a <<<...>>> launch: reports a bad configuration at once
// (errors raised later by the running kernel surface at the next sync).
inline KernelStatus launch_status() { return to_status(cudaGetLastError()); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a kernel that walks `work` items with a block-stride loop: as
// many as the current device holds at once (so none waits for a free SM), and
// never more than there are items.
template <typename Kernel>
inline unsigned resident_blocks(Kernel kernel, int threads, size_t smem_bytes, int64_t work) {
  int device = 0, sms = 1, per_sm = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes);
  const int64_t resident = int64_t{std::max(sms, 1)} * std::max(per_sm, 1);
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(work, resident)));
}

template <typename Index>
struct DividerFor;
template <> struct DividerFor<uint32_t> { using type = IntDivider; };
template <> struct DividerFor<int64_t> { using type = PlainDivider64; };

template <typename Index>
inline typename DividerFor<Index>::type make_divider(int64_t d) {
  if constexpr (sizeof(Index) == 4) {
    return IntDivider(static_cast<uint32_t>(d));
  } else {
    return PlainDivider64{d};
  }
}

}  // namespace baracuda
