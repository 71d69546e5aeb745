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

// The answer of `compute()` for `key`, computed once and kept (one table
// per call site: each passes its own lambda). For host queries about a
// kernel on a device that cost more than the kernels they launch.
template <typename Key, typename Compute>
inline auto remembered(const Key& key, Compute compute) -> decltype(compute()) {
  static std::mutex mutex;
  static std::map<Key, decltype(compute())> answer_of;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = answer_of.find(key);
    if (it != answer_of.end()) return it->second;
  }
  const auto answer = compute();
  std::lock_guard<std::mutex> lock(mutex);
  answer_of[key] = answer;
  return answer;
}

inline int current_device() {
  int device = 0;
  cudaGetDevice(&device);
  return device;
}

// How many blocks of `kernel` the device holds at once. The occupancy query
// costs ~8 µs of host time (measured on an H100 host), more than many of
// these kernels run, so each answer is kept.
template <typename Kernel>
inline int64_t resident_capacity(Kernel kernel, int threads, size_t smem_bytes) {
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), current_device(),
                                   threads, smem_bytes);
  return remembered(key, [&] {
    int per_sm = 1;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes);
    return multiprocessors() * int64_t{std::max(per_sm, 1)};
  });
}

// Whether `kernel`, as loaded for the current device, was compiled for
// compute capability 9.0 or more (its PTX target, what __CUDA_ARCH__ read
// while it compiled). Not the same as the device's own: a build for older
// targets runs on a newer GPU from its PTX, with the parts of its kernels
// that need 9.0 compiled out. Asked once per kernel and device.
template <typename Kernel>
inline bool kernel_compiled_for_sm90(Kernel kernel) {
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), current_device());
  return remembered(key, [&] {
    cudaFuncAttributes attributes;
    // ptxVersion is major * 10 + minor of the PTX target (90 for compute_90).
    return cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel)) ==
               cudaSuccess &&
           attributes.ptxVersion >= 90;
  });
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
