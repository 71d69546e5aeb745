// Launching a kernel behind the zeroing of its workspace (ticket counters,
// ready flags), for kernels that need it zero at their start. A memset and
// then the kernel cost two launch gaps ahead of the kernel's first load;
// where the kernels are compiled for compute capability 9.0 and up, both
// launches here are programmatic (hopper.cuh), so each kernel is resident
// and waiting by the time its predecessor finishes (measured in
// benchmarks/RESULTS.md, scan section).
// No torch headers.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "common/cuda_launch.cuh"
#include "common/hopper.cuh"

namespace baracuda {

namespace {

// Zeroes `count` 16-byte words. The words may be a workspace that the
// kernel ahead in the stream still uses, so it waits for that kernel first,
// and only then lets the kernel behind it launch: that one reads memory
// written before this one.
__global__ void zero_words_kernel(uint4* words, int64_t count) {
  grid_dependency_wait();
  grid_dependents_launch();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t w = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < count; w += stride) {
    words[w] = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace

// Launches `kernel`, programmatically where `programmatic`: it may then start
// before the kernel ahead finishes and must call grid_dependency_wait first.
template <typename... Params, typename... Args>
KernelStatus launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                           cudaStream_t stream, bool programmatic, Args&&... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  return to_status(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// Zeroes `bytes` (a multiple of 16) at `workspace` (16-byte aligned), then
// launches `kernel`, which must call grid_dependency_wait before it touches
// the workspace or anything the stream wrote before. Programmatic only
// where both kernels were compiled for compute capability 9.0 or more:
// compiled for less, their waits are empty, and the launches are plain.
template <typename... Params, typename... Args>
KernelStatus launch_behind_zeroing(void* workspace, int64_t bytes, void (*kernel)(Params...),
                                   dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                                   Args&&... args) {
  constexpr int kZeroThreads = 256;
  constexpr int64_t kZeroBlocks = 64;  // a few KiB to a few MiB of words
  const bool programmatic =
      kernel_compiled_for_sm90(zero_words_kernel) && kernel_compiled_for_sm90(kernel);
  const int64_t words = bytes / 16;
  const int64_t zero_grid = std::min(std::max<int64_t>(ceil_div(words, kZeroThreads), 1), kZeroBlocks);
  const KernelStatus st =
      launch_kernel(zero_words_kernel, dim3(static_cast<unsigned>(zero_grid)), dim3(kZeroThreads),
                    0, stream, programmatic, static_cast<uint4*>(workspace), words);
  if (!st.is_ok()) return st;
  return launch_kernel(kernel, grid, block, smem_bytes, stream, programmatic,
                       std::forward<Args>(args)...);
}

}  // namespace baracuda
