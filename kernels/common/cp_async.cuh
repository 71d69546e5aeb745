// Asynchronous global -> shared copies (sm_80+): the data goes straight to
// shared memory without passing through registers, so a thread can have many
// copies in flight. No torch headers.
#pragma once

#include <cstdint>

namespace baracuda {

__device__ inline uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; bytes beyond `valid` (0 or 16) are zero-filled.
// kPrefetch256: L2 also fetches the whole aligned 256 bytes around `src`
// from memory (the .L2::256B prefetch size), for copies whose neighbours
// another SM is about to ask for.
template <bool kPrefetch256 = false>
__device__ inline void cp_async16(void* dst, const void* src, bool valid = true) {
  if constexpr (kPrefetch256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(
                     smem_address(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
  }
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
// The "memory" clobber keeps the compiler from moving this thread's reads of
// the copied shared memory above the wait: a thread may read its own copies
// right after, with no barrier between.
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace baracuda
