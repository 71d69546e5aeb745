// Hopper executor of block-sparse attention (float16 / bfloat16, head_dim ==
// v_dim in {64, 128}, block_q and block_k multiples of 64): warpgroup MMAs
// (wgmma) fed by the tensor copy engine (TMA) through a ring of shared-memory
// stages, FlashAttention style with float32 accumulation.
//
// The grid is persistent: each CTA works through a sequence of work items,
// an item being M = 64 * kConsumers query rows of one (batch, head), all in
// one query block. Warps 0 .. 4 kConsumers - 1 form kConsumers warpgroups of
// 64 rows each; the warps after them produce: one thread takes the items,
// loads each item's Q, walks its key tiles (N keys, only the tiles whose mask
// block is on and, with causal attention, up to the diagonal) and copies each
// K and V tile into the next free stage, running on into the next item while
// the consumers finish the current one. A consumer warpgroup, per tile:
//   S = Q K^T     wgmma, Q and K from shared memory (K-major)
//   P = online softmax of S, kept in registers as the next MMA's A fragments
//   O += P V      wgmma, P from registers, V from shared memory (MN-major)
// and then frees the stage. The two warpgroups share every K/V tile but run
// their softmax and MMAs independently, so one's exponentials overlap the
// other's MMAs. (Freeing K and V on their own, K right after the score MMAs,
// measured slower on dense masks and no faster on sparse ones.)
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "block_sparse_attention/block_sparse_attention_hopper.cuh"
#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "block_sparse_attention/block_sparse_attention_tile.cuh"
#include "common/cuda_launch.cuh"
#include "common/hopper.cuh"
#include "common/tensor_map.h"
#include "common/wgmma_ops.cuh"

namespace baracuda {
namespace {

// One consumer warpgroup's share of every work item the CTA is handed: the
// walk over the item's key tiles, then its epilogue. The MMAs of consecutive
// tiles overlap the softmax: P V of tile i - 1 runs on the tensor cores while
// the exponentials of tile i are computed. (Making the two warpgroups also
// take turns issuing MMAs, ping-pong, gained at most 6 % and lost at D 128:
// see the design notes.) The ring position `it` runs on across items, as
// the producer's does.
template <typename T, int D, int kConsumers, int N, int STAGES, int kTests>
__device__ inline void consume(const BlockSparseAttentionArgs& a, int64_t q_tiles,
                               const Ring<T>& ring, int warp, int lane) {
  constexpr int M = 64 * kConsumers;
  const int wg = warp / 4, wg_warp = warp % 4;
  const int g = lane >> 2, t4 = lane & 3;
  const float scale_log2 = static_cast<float>(a.scale) * kLog2e;
  // The warpgroup's 64 rows of Q: panel p holds columns [64 p, 64 p + 64).
  const T* q_rows = ring.q + wg * 64 * kPanel;

  float s[N / 2];
  uint32_t p[N / 16][4];  // P of the previous tile, as A fragments
  float corr[2];
  int it = 0;  // ring entries taken so far

  // The next ring entry, once its K tile (if any) has landed.
  auto wait_entry = [&] {
    const int stage = it % STAGES;
    mbarrier_wait(&ring.k_full[stage], (it / STAGES) & 1);
    return *reinterpret_cast<volatile int*>(&ring.tile_of[stage]);
  };
  auto release = [&](uint64_t* bar) {
    if (lane == 0) mbarrier_arrive(bar);
  };
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) p[kk][i] = pack2<T>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
    }
  };

  for (int n = 0;; ++n) {
    mbarrier_wait(ring.q_full, n & 1);
    const int item = *reinterpret_cast<volatile int*>(ring.q_item);
    if (item < 0) break;
    const QueryTile qt = query_tile(a, item, q_tiles, M);
    const int64_t wg_row0 = qt.q0 + wg * 64;           // first row of this warpgroup
    const int64_t row_g = wg_row0 + wg_warp * 16 + g;  // rows row_g and row_g + 8
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    OnlineSoftmaxRows softmax;
    const LaneRowKeys row_keys(a, qt.b, row_g);
    // Scores of key tile `tile` in s -> P in s (running max and sums updated).
    auto softmax_of = [&](int tile) {
      register_fence(s);
      const float factor = mask_scores<N / 8>(s, scale_log2, tile * N, row_keys, t4);
      mask_elements<kTests, N / 8>(s, a, qt.b, qt.h, row_g, tile * N, t4);
      softmax.update<N / 8>(s, factor, corr);
    };
    // With per-batch key counts, the rows of a V tile past this batch's keys
    // hold whatever the cache holds there (NaN, say); P is 0 for them, but
    // 0 * NaN is NaN, so they are zeroed before the P V MMAs read the tile.
    auto wait_values = [&](int stage, uint32_t parity, int tile) {
      mbarrier_wait(&ring.v_full[stage], parity);
      if (a.kv_lens != nullptr) {
        const int first_junk = static_cast<int>(keys_of(a, qt.b)) - tile * N;
        if (first_junk < N) zero_rows_from<T, D, N>(ring.v + stage * N * D, first_junk, wg);
      }
    };

    int entry = wait_entry();
    if (entry == kNoTile) {
      release(&ring.empty[it % STAGES]);
      ++it;
      release(ring.q_empty);
    } else {
      int stage = it % STAGES;
      wgmma_fence();
      issue_scores<T, D, M, N>(s, q_rows, ring.k + stage * N * D);
      wgmma_wait<0>();
      // Q is read by the score MMAs only: after the last one the producer may
      // load the next item's Q while this item finishes.
      if (entry & kLastTile) release(ring.q_empty);
      softmax_of(entry & ~kLastTile);  // o is still 0: no rescale
      pack_p();
      int prev = stage;  // stage of the tile whose P is in p
      int prev_tile = entry & ~kLastTile;
      uint32_t prev_parity = (it / STAGES) & 1;
      ++it;
      while (!(entry & kLastTile)) {
        entry = wait_entry();
        stage = it % STAGES;
        // V is waited for (and its junk rows zeroed) while no MMA is in
        // flight: code that may diverge between the issues of in-flight
        // MMAs makes the compiler serialise every wgmma of the kernel.
        wait_values(prev, prev_parity, prev_tile);
        wgmma_fence();
        issue_scores<T, D, M, N>(s, q_rows, ring.k + stage * N * D);
        issue_values<T, D, N>(o, p, ring.v + prev * N * D);
        wgmma_wait<1>();  // the scores are in; P V may still run
        if (entry & kLastTile) release(ring.q_empty);
        softmax_of(entry & ~kLastTile);
        wgmma_wait<0>();
        register_fence(o);
        // Both MMAs that read the previous stage are complete: free it.
        release(&ring.empty[prev]);
        OnlineSoftmaxRows::rescale<D / 8>(o, corr);
        pack_p();
        prev = stage;
        prev_tile = entry & ~kLastTile;
        prev_parity = (it / STAGES) & 1;
        ++it;
      }
      wait_values(prev, prev_parity, prev_tile);
      wgmma_fence();
      issue_values<T, D, N>(o, p, ring.v + prev * N * D);
      wgmma_wait<0>();
      register_fence(o);
      release(&ring.empty[prev]);
    }
    softmax.store<T, D / 8>(a, qt, o, row_g, t4);
  }
}

// A persistent grid of as many CTAs as fit at once: one 128-row CTA per SM
// (which moves registers from the producer to the consumers), or 64-row CTAs
// sized so that at least two share an SM (one would leave the tensor cores
// idle during its softmax), except with 256-wide heads, whose accumulator
// alone takes 128 registers a thread.
template <typename T, int D, int kConsumers, int N, int STAGES, int kTests>
__global__ void __launch_bounds__(hopper_threads<kConsumers>(),
                                  kConsumers == 1 && D <= 128 ? 2 : 1)
    hopper_attention(const __grid_constant__ CUtensorMap q_map,
                     const __grid_constant__ CUtensorMap k_map,
                     const __grid_constant__ CUtensorMap v_map, const BlockSparseAttentionArgs a,
                     int64_t q_tiles, int* work_counter) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int M = 64 * kConsumers;
  using L = HopperLayout<D, M, N, STAGES>;
  extern __shared__ unsigned char smem_raw[];
  const Ring<T> ring = carve_ring<T, HopperLayout<D, M, N, STAGES>>(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) init_ring(ring, STAGES, kConsumers * 4);
  __syncthreads();

  // 128 x 40 + 256 x 232 registers fill the 64 K of an SM.
  constexpr bool kMoveRegisters = kConsumers == 2;
  if (warp >= kConsumers * 4) {
    if constexpr (kMoveRegisters) warpgroup_registers_release<40>();
    if (warp == kConsumers * 4 && lane == 0) {
      const QueryOperands<1> query{{&q_map}, {a.q_strides}};
      produce<T, D, M, N, STAGES>(query, &k_map, &v_map, a, q_tiles, work_counter, ring);
    }
  } else {
    if constexpr (kMoveRegisters) warpgroup_registers_claim<232>();
    consume<T, D, kConsumers, N, STAGES, kTests>(a, q_tiles, ring, warp, lane);
  }
#endif
}

// ---------------------------------------------------------------- host side

template <typename T, int D, int kConsumers, int N>
KernelStatus launch(const BlockSparseAttentionArgs& a, int* work_counter, cudaStream_t stream) {
  constexpr int M = 64 * kConsumers;
  // Three stages where they fit in the 227 KiB one CTA may have; 64-row
  // CTAs keep two so that two of them fit on an SM (not with 256-wide
  // heads, one CTA per SM).
  constexpr bool kOnePerSm = kConsumers > 1 || D > 128;
  constexpr int kStages =
      kOnePerSm && HopperLayout<D, M, N, 3>::kAllocBytes <= 227 * 1024 ? 3 : 2;
  using L = HopperLayout<D, M, N, kStages>;
  const int64_t q_tiles = ceil_div(a.q_len, M);
  const int64_t items = q_tiles * a.batch * a.heads * a.kv_splits;
  if (items == 0) return KernelStatus::ok();
  if (items > 0x7fffffff) return KernelStatus::invalid("too many query tiles for one grid");
  CUtensorMap q_map, k_map, v_map;
  if (!encode_operand(&q_map, a.dtype, a.q, a.batch, a.heads, a.q_len, D, a.q_strides, M) ||
      !encode_operand(&k_map, a.dtype, a.k, a.batch, a.kv_heads, a.k_len, D, a.k_strides, N) ||
      !encode_operand(&v_map, a.dtype, a.v, a.batch, a.kv_heads, a.k_len, D, a.v_strides, N)) {
    return KernelStatus::invalid("could not describe q, k or v to the tensor copy engine");
  }
  // An instantiation per level of per-element tests: reading exact-mask
  // bits costs the 64-row D = 128 kernel about 60 bytes of spills even
  // where it never runs.
  const auto kernel = dispatch_element_tests(element_tests(a), [](auto tests) {
    return hopper_attention<T, D, kConsumers, N, kStages, decltype(tests)::value>;
  });
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kAllocBytes);
  if (err != cudaSuccess) return to_status(err);
  const int threads = hopper_threads<kConsumers>();
  const int64_t ctas = std::min(items, resident_capacity(kernel, threads, L::kAllocBytes));
  kernel<<<static_cast<unsigned>(ctas), threads, L::kAllocBytes, stream>>>(q_map, k_map, v_map, a,
                                                                          q_tiles, work_counter);
  return launch_status();
}

template <typename T, int D>
KernelStatus launch_for_blocks(const BlockSparseAttentionArgs& a, int* counter, cudaStream_t s) {
  // 128 query rows (two warpgroups) when the query block allows it; 128-key
  // tiles when the key block does and both warpgroups share them. 256-wide
  // heads take 64 rows and 64 keys, one CTA per SM: two warpgroups would
  // spill (ptxas: 140 bytes and more past the 232 registers they get).
  if constexpr (D <= 128) {
    if (a.block_q % 128 == 0) {
      return a.block_k % 128 == 0 ? launch<T, D, 2, 128>(a, counter, s)
                                  : launch<T, D, 2, 64>(a, counter, s);
    }
  }
  return launch<T, D, 1, 64>(a, counter, s);
}

template <typename T>
KernelStatus launch_for_dtype(const BlockSparseAttentionArgs& a, int* counter, cudaStream_t s) {
  if (a.head_dim == 64) return launch_for_blocks<T, 64>(a, counter, s);
  if (a.head_dim == 128) return launch_for_blocks<T, 128>(a, counter, s);
  return launch_for_blocks<T, 256>(a, counter, s);
}

}  // namespace

bool block_sparse_attention_hopper_available(int device) {
#if defined(BARACUDA_SM90A)
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return false;
  }
  return major == 9 && tensor_map_encoder() != nullptr;
#else
  (void)device;
  return false;
#endif
}

KernelStatus block_sparse_attention_hopper_cuda(const BlockSparseAttentionArgs& a, int* work_counter,
                                               void* stream) {
  if (tensor_core_tile_rows(a) == 0) {
    return KernelStatus::invalid("problem not eligible for the Hopper kernel");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  if (a.dtype == FloatDtype::kFloat16) return launch_for_dtype<__half>(a, work_counter, s);
  return launch_for_dtype<__nv_bfloat16>(a, work_counter, s);
}

}  // namespace baracuda
