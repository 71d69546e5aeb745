// Launch-side helpers shared by every .cu file: CUDA error -> KernelStatus,
// and the index dividers used by strided kernels. No torch headers.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

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

// Multiprocessors of the current device.
inline int64_t multiprocessors() {
  int device = 0, sms = 1;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return std::max(sms, 1);
}

// How many blocks of `kernel` the device holds at once.
template <typename Kernel>
inline int64_t resident_capacity(Kernel kernel, int threads, size_t smem_bytes) {
  int device = 0;
  cudaGetDevice(&device);
  // The occupancy query costs ~8 µs of host time (measured on an H100 host),
  // more than many of these kernels run, so each answer is kept.
  using Key = std::tuple<const void*, int, int, size_t>;
  static std::mutex mutex;
  static std::map<Key, int64_t> resident_of;
  const Key key{reinterpret_cast<const void*>(kernel), device, threads, smem_bytes};
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = resident_of.find(key);
    if (it != resident_of.end()) return it->second;
  }
  int per_sm = 1;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes);
  const int64_t resident = multiprocessors() * std::max(per_sm, 1);
  std::lock_guard<std::mutex> lock(mutex);
  resident_of[key] = resident;
  return resident;
}

// Whether `kernel`, as loaded for the current device, was compiled for
// compute capability 9.0 or more (its PTX target, what __CUDA_ARCH__ read
// while it compiled). Not the same as the device's own: a build for older
// targets runs on a newer GPU from its PTX, with the parts of its kernels
// that need 9.0 compiled out. Asked once per kernel and device.
template <typename Kernel>
inline bool kernel_compiled_for_sm90(Kernel kernel) {
  int device = 0;
  cudaGetDevice(&device);
  using Key = std::tuple<const void*, int>;
  static std::mutex mutex;
  static std::map<Key, bool> answer_of;
  const Key key{reinterpret_cast<const void*>(kernel), device};
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = answer_of.find(key);
    if (it != answer_of.end()) return it->second;
  }
  cudaFuncAttributes attributes;
  // ptxVersion is major * 10 + minor of the PTX target (90 for compute_90).
  const bool answer =
      cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel)) == cudaSuccess &&
      attributes.ptxVersion >= 90;
  std::lock_guard<std::mutex> lock(mutex);
  answer_of[key] = answer;
  return answer;
}

// Blocks for a kernel that walks `work` items with a block-stride loop: no
// more than the device holds at once (so none waits for a free SM), and no
// more than it takes to finish in the same number of rounds, so that every
// block gets the same number of items, give or take one. (8192 items on 528
// resident blocks would be 15.5 rounds, half the blocks idle in the last;
// 512 blocks run 16 full ones.)
template <typename Kernel>
inline unsigned resident_blocks(Kernel kernel, int threads, size_t smem_bytes, int64_t work) {
  if (work <= 0) return 1;
  const int64_t resident = resident_capacity(kernel, threads, smem_bytes);
  const int64_t rounds = ceil_div(work, resident);
  return static_cast<unsigned>(ceil_div(work, rounds));
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
