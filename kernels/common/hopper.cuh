// Hopper (sm_90) building blocks: transaction barriers in shared memory, the
// bulk tensor copy engine (TMA), programmatic dependent launch and the
// warpgroup matrix-multiply fences and shared-memory descriptors. Everything
// here needs compute capability 9.0 (the PDL calls compile to nothing below
// it); the wgmma parts need the sm_90a target. No torch headers.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cp_async.cuh"

namespace baracuda {

// ---------------------------------------------------------------- mbarrier
//
// A 64-bit barrier in shared memory that completes a phase once `count`
// threads have arrived and every byte announced with expect_tx has landed.
// Waiters name the phase they wait for by its parity (0 for the first).

__device__ inline void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count));
}

// Makes initialised barriers visible to the copy engine; follow with a
// block-wide barrier before any thread uses them.
__device__ inline void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` still to come from the copy engine.
__device__ inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   smem_address(bar)),
               "r"(bytes)
               : "memory");
}

__device__ inline void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

__device__ inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// ---------------------------------------------------------------- PDL
//
// Programmatic dependent launch: a kernel launched with the
// programmatic-stream-serialization attribute may start while the kernel
// ahead of it in the stream still runs, once that one has called
// grid_dependents_launch (or finished). It may prepare, but must call
// grid_dependency_wait before it touches memory the kernel ahead writes: the
// wait returns once that kernel has finished and its writes are visible.
// Memory written before the kernel ahead is safe to read only where that
// kernel itself waited for its own predecessors before it let dependents
// launch. Without the attribute both calls return at once; below compute
// capability 9.0 they compile to nothing, so kernels built for every
// architecture may call them.

__device__ inline void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ inline void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------- TMA

// How the lines a bulk copy brings in stand in L2: kNormal, or kEvictFirst
// for data read once, whose lines then go before the others.
enum class L2Lines { kNormal, kEvictFirst };

// The cache policy of kEvictFirst, for a copy's .L2::cache_hint operand.
__device__ inline uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// `bytes` (a multiple of 16, from and to 16-byte aligned addresses) of
// global memory into shared memory, by the bulk copy engine without a tensor
// map; completion is counted on `bar` in bytes.
template <L2Lines kLines = L2Lines::kNormal>
__device__ inline void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes,
                                           uint64_t* bar) {
  if constexpr (kLines == L2Lines::kEvictFirst) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1], %2, [%3], %4;\n" ::"r"(smem_address(dst)),
        "l"(src), "r"(bytes), "r"(smem_address(bar)), "l"(l2_evict_first_policy())
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
            "r"(smem_address(dst)),
        "l"(src), "r"(bytes), "r"(smem_address(bar))
        : "memory");
  }
}

// `bytes` (a multiple of 16, from and to 16-byte aligned addresses) of
// shared memory out to global memory by the bulk copy engine, as one bulk
// group of the calling thread. The source must not be written again before
// bulk_store_wait_read in the same thread, nor the block exit before
// bulk_store_wait_all.
__device__ inline void bulk_store_to_global(void* dst, const void* src, uint32_t bytes) {
  asm volatile(
      "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(dst),
      "r"(smem_address(src)), "r"(bytes)
      : "memory");
}
// Until the calling thread's bulk stores have read their sources.
__device__ inline void bulk_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Until the calling thread's bulk stores are complete.
__device__ inline void bulk_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Adds `bytes` (a multiple of 16, 16-byte aligned) of float32 from shared
// memory into global memory, element by element, in L2 by the bulk copy
// engine: one bulk group of the calling thread (bulk_store_wait_read,
// bulk_store_wait_all as for bulk_store_to_global).
__device__ inline void bulk_reduce_add_to_global(float* dst, const float* src, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(dst),
      "r"(smem_address(src)), "r"(bytes)
      : "memory");
}

// A flag in global memory shared between CTAs: the load orders the
// caller's later accesses after it (acquire), the store its earlier ones
// before it (release), both at GPU scope.
__device__ inline int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ inline void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Orders the calling thread's memory accesses through the generic proxy
// and through the async proxy (bulk copies) with each other, in every
// state space: bulk writes waited for before a release, or issued after
// an acquire.
__device__ inline void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async;\n" ::: "memory");
#endif
}

// Orders the calling thread's earlier shared-memory accesses (generic
// proxy) before bulk copies issued after a later barrier (async proxy): a
// stage written by threads and then refilled by the copy engine.
__device__ inline void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// One box of a 4-D tensor map into shared memory (1024-byte aligned for the
// 128-byte swizzle); completion is counted on `bar` in bytes. Coordinates are
// in elements, innermost first; out-of-range parts of the box read as zero.
__device__ inline void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2,
                                   int c3, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(smem_address(bar))
      : "memory");
}

// One box of a 3-D tensor map into shared memory (1024-byte aligned for the
// 128-byte swizzle), its lines held in L2 as kLines says; completion is
// counted on `bar` in bytes (the whole box, out-of-range parts read as
// zero). Coordinates are in elements, innermost first.
template <L2Lines kLines = L2Lines::kNormal>
__device__ inline void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2,
                                   uint64_t* bar) {
  if constexpr (kLines == L2Lines::kEvictFirst) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        ".L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(smem_address(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(bar)),
        "l"(l2_evict_first_policy())
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_address(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(bar))
        : "memory");
  }
}

// One box of shared memory (laid out as tma_load_3d leaves it) out to a 3-D
// tensor map, as one bulk group of the calling thread: the same rules as
// bulk_store_to_global (bulk_store_wait_read, bulk_store_wait_all).
__device__ inline void tma_store_3d(const CUtensorMap* map, int c0, int c1, int c2,
                                    const void* src) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n"
      "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(src))
      : "memory");
}

// ---------------------------------------------------------------- wgmma

// Orders this thread's register accesses before the warpgroup MMAs issued next.
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed MMA groups of the warpgroup are in flight.
template <int N>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Moves registers between warpgroups (the kernel must start with a register
// cap, __launch_bounds__(threads, 1)): a warpgroup that only issues copies
// gives most of its registers up so the MMA warpgroups can hold more.
template <int REGS>
__device__ inline void warpgroup_registers_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ inline void warpgroup_registers_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// Pins a register at this point of the program: accumulators that an
// in-flight MMA writes must not be read or moved across the wait.
template <int N>
__device__ inline void register_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Shared-memory matrix descriptor for a tile stored with the 128-byte swizzle
// (rows of 128 bytes, groups of 8 rows 1024 bytes apart, as TMA writes it
// with CU_TENSOR_MAP_SWIZZLE_128B). `leading_bytes` is the distance between
// 64-element column panels for an MN-major operand (unused for K-major).
__device__ inline uint64_t swizzle128_descriptor(const void* tile, uint32_t leading_bytes) {
  const uint64_t address = smem_address(tile);
  return ((address & 0x3FFFF) >> 4) | (uint64_t{(leading_bytes >> 4) & 0x3FFF} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

}  // namespace baracuda
