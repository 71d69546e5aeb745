// Launch-side helpers shared by every .cu file: CUDA error -> KernelStatus,
// and the index dividers used by strided kernels. No torch headers.
#pragma once

#include <cuda_runtime.h>

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
