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
//
// Tiles are stored as TMA writes them with the 128-byte swizzle: a tile of
// `rows` x D is D / 64 panels of rows x 64 elements (128-byte rows, 8-row
// groups 1024 bytes apart), which is the layout the wgmma descriptors name.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "block_sparse_attention/block_sparse_attention_tile.cuh"
#include "common/cuda_launch.cuh"
#include "common/hopper.cuh"
#include "common/tensor_map.h"
#include "common/wgmma_ops.cuh"

namespace baracuda {
namespace {

constexpr int kPanel = 64;  // elements per 128-byte swizzled row

// Threads of a CTA: the consumer warpgroups, then a producer warpgroup when
// registers move between them (two consumers), else a single producer warp.
template <int kConsumers>
constexpr int hopper_threads() {
  return kConsumers == 2 ? 3 * 128 : kConsumers * 128 + 32;
}

template <int D, int M, int N, int STAGES>
struct HopperLayout {
  static constexpr int kQBytes = M * D * 2;
  static constexpr int kKVBytes = N * D * 2;  // one K or V tile
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQBytes;
  static constexpr int kVOffset = kKOffset + STAGES * kKVBytes;
  static constexpr int kBarrierOffset = kVOffset + STAGES * kKVBytes;
  // q_full, q_empty, then k_full, v_full and empty per stage.
  static constexpr int kTileOffset = kBarrierOffset + (2 + 3 * STAGES) * 8;
  static constexpr int kBytes = kTileOffset + (STAGES + 1) * 4;  // tile_of[], q_item
  // The swizzled tiles need 1024-byte alignment; the dynamic allocation only
  // guarantees 16, so the kernel rounds its base up inside this slack.
  static constexpr int kAllocBytes = kBytes + 1024;
};

// The shared memory of a CTA. Stage s of the ring holds one K and one V
// tile; k_full[s] completes when its K tile has landed (and tile_of[s], the
// producer's word on that entry, is written), v_full[s] when its V tile has,
// and empty[s] when every consumer warp is done with both. q_full completes
// when the Q tile of work item *q_item (or -1: no more work) is in, q_empty
// when every consumer warp has issued its last score MMA on it.
template <typename T>
struct Ring {
  T *q, *k, *v;
  uint64_t *q_full, *q_empty, *k_full, *v_full, *empty;
  int *tile_of, *q_item;
};

// The tensor-map coordinate of batch or head `index` along an axis of the
// given stride: a stride-0 axis is described to the map as one element.
__device__ inline int coordinate(int64_t index, int64_t stride) {
  return stride != 0 ? static_cast<int>(index) : 0;
}

// S = Q K^T of one key tile: D / 16 k-steps, each 32 bytes further along the
// swizzled rows of Q and K (the 64-element panels are rows x 128 bytes).
template <typename T, int D, int M, int N>
__device__ inline void issue_scores(float (&s)[N / 2], const T* q_rows, const T* ks) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int panel = kk / 4, col = (kk % 4) * 16;
    wgmma_ss<T, N>(s, swizzle128_descriptor(q_rows + panel * M * kPanel + col, 0),
                   swizzle128_descriptor(ks + panel * N * kPanel + col, 0), kk > 0);
  }
  wgmma_commit();
}

// O += P V of one key tile: k-step kk takes keys [16 kk, 16 kk + 16), i.e.
// 16 rows of V; V's 64-column panels are N * 128 bytes apart (its MN stride).
template <typename T, int D, int N>
__device__ inline void issue_values(float (&o)[D / 2], const uint32_t (&p)[N / 16][4],
                                    const T* vs) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    wgmma_rs<T, D>(o, p[kk], swizzle128_descriptor(vs + kk * 16 * kPanel, N * kPanel * 2), true);
  }
  wgmma_commit();
}

// What the producer publishes in tile_of[stage] with each ring entry: a key
// tile index, flagged when it is the work item's last, or kNoTile for an
// item that visits no key tile at all (the entry then carries no data).
constexpr int kLastTile = 1 << 30;
constexpr int kNoTile = -1;

// One consumer warpgroup's share of every work item the CTA is handed: the
// walk over the item's key tiles, then its epilogue. The MMAs of consecutive
// tiles overlap the softmax: P V of tile i - 1 runs on the tensor cores while
// the exponentials of tile i are computed. (Making the two warpgroups also
// take turns issuing MMAs measured no faster.) The ring position `it` runs
// on across items, as the producer's does.
template <typename T, int D, int kConsumers, int N, int STAGES>
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
    // Scores of key tile `tile` in s -> P in s (running max and sums updated).
    auto softmax_of = [&](int tile) {
      register_fence(s);
      scale_and_mask<N / 8>(s, a, scale_log2, int64_t{tile} * N, wg_row0, row_g, t4);
      softmax.update<N / 8>(s, corr);
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
      uint32_t prev_parity = (it / STAGES) & 1;
      ++it;
      while (!(entry & kLastTile)) {
        entry = wait_entry();
        stage = it % STAGES;
        wgmma_fence();
        issue_scores<T, D, M, N>(s, q_rows, ring.k + stage * N * D);
        mbarrier_wait(&ring.v_full[prev], prev_parity);
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
        prev_parity = (it / STAGES) & 1;
        ++it;
      }
      mbarrier_wait(&ring.v_full[prev], prev_parity);
      wgmma_fence();
      issue_values<T, D, N>(o, p, ring.v + prev * N * D);
      wgmma_wait<0>();
      register_fence(o);
      release(&ring.empty[prev]);
    }
    softmax.store<T, D / 8>(a, qt, o, row_g, t4);
  }
}

// The producer thread: takes work items (query tiles, in query_tile's order)
// until none is left, first its CTA's own and then from the shared counter,
// so that CTAs that drew light items take more. Per item it hands over the
// first key tile, loads Q once the previous item's score MMAs are done, then
// streams the remaining K/V tiles into the ring; an item of index -1 tells
// the consumers to stop.
template <typename T, int D, int M, int N, int STAGES>
__device__ inline void produce(const CUtensorMap* q_map, const CUtensorMap* k_map,
                               const CUtensorMap* v_map, const BlockSparseAttentionArgs& a,
                               int64_t q_tiles, int* work_counter, const Ring<T>& ring) {
  using L = HopperLayout<D, M, N, STAGES>;
  constexpr int kPanels = D / kPanel;
  const int64_t items = q_tiles * a.batch * a.heads;
  int64_t item = blockIdx.x;
  int it = 0;  // ring entries filled so far
  // The next ring stage, once the consumers freed its previous use.
  auto next_stage = [&] {
    const int stage = it % STAGES;
    if (it >= STAGES) mbarrier_wait(&ring.empty[stage], ((it / STAGES) - 1) & 1);
    ++it;
    return stage;
  };
  for (int n = 0;; ++n) {
    if (item >= items) {
      if (n > 0) mbarrier_wait(ring.q_empty, (n - 1) & 1);
      *ring.q_item = -1;  // published by the arrival (release semantics)
      mbarrier_arrive(ring.q_full);
      return;
    }
    const QueryTile qt = query_tile(a, item, q_tiles, M);
    const int kh = coordinate(qt.kv_head, a.k_strides[1]), kb = coordinate(qt.b, a.k_strides[0]);
    const int vh = coordinate(qt.kv_head, a.v_strides[1]), vb = coordinate(qt.b, a.v_strides[0]);
    const KeyTileWalk walk(a, qt, N);
    // One ring entry: key tile `tile`, flagged when it is the item's last.
    auto push_tile = [&](int tile, bool last) {
      const int stage = next_stage();
      ring.tile_of[stage] = tile | (last ? kLastTile : 0);
      const int key0 = tile * N;
      T* k_dst = ring.k + stage * N * D;
      T* v_dst = ring.v + stage * N * D;
      mbarrier_arrive_expect_tx(&ring.k_full[stage], L::kKVBytes);
      for (int p = 0; p < kPanels; ++p) {
        tma_load_4d(k_dst + p * N * kPanel, k_map, p * kPanel, key0, kh, kb, &ring.k_full[stage]);
      }
      mbarrier_arrive_expect_tx(&ring.v_full[stage], L::kKVBytes);
      for (int p = 0; p < kPanels; ++p) {
        tma_load_4d(v_dst + p * N * kPanel, v_map, p * kPanel, key0, vh, vb, &ring.v_full[stage]);
      }
    };
    // The first entry goes out before Q: its K/V do not wait for the Q buffer,
    // so their loads overlap the end of the previous item.
    int tile = walk.next(0);
    int following = tile < walk.n_tiles ? walk.next(tile + 1) : tile;
    if (tile >= walk.n_tiles) {
      const int stage = next_stage();
      ring.tile_of[stage] = kNoTile;
      mbarrier_arrive(&ring.k_full[stage]);
      // Nobody waits for this entry's V, but the phases of v_full must keep
      // counting ring entries, as the consumers' parities do.
      mbarrier_arrive(&ring.v_full[stage]);
    } else {
      push_tile(tile, following >= walk.n_tiles);
    }
    if (n > 0) mbarrier_wait(ring.q_empty, (n - 1) & 1);
    const int qh = coordinate(qt.h, a.q_strides[1]), qb = coordinate(qt.b, a.q_strides[0]);
    *ring.q_item = static_cast<int>(item);
    mbarrier_arrive_expect_tx(ring.q_full, L::kQBytes);
    for (int p = 0; p < kPanels; ++p) {
      tma_load_4d(ring.q + p * M * kPanel, q_map, p * kPanel, static_cast<int>(qt.q0), qh, qb,
                  ring.q_full);
    }
    while (following < walk.n_tiles) {
      tile = following;
      following = walk.next(tile + 1);
      push_tile(tile, following >= walk.n_tiles);
    }
    // Claimed now, while the consumers still work on this item, so that the
    // counter's round trip is off the path to the next item's first loads.
    item = int64_t{gridDim.x} + atomicAdd(work_counter, 1);
  }
}

// A persistent grid of as many CTAs as fit at once: one 128-row CTA per SM
// (which moves registers from the producer to the consumers), or 64-row CTAs
// sized so that at least two share an SM (one would leave the tensor cores
// idle during its softmax).
template <typename T, int D, int kConsumers, int N, int STAGES>
__global__ void __launch_bounds__(hopper_threads<kConsumers>(), kConsumers == 1 ? 2 : 1)
    hopper_attention(const __grid_constant__ CUtensorMap q_map,
                     const __grid_constant__ CUtensorMap k_map,
                     const __grid_constant__ CUtensorMap v_map, const BlockSparseAttentionArgs a,
                     int64_t q_tiles, int* work_counter) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int M = 64 * kConsumers;
  using L = HopperLayout<D, M, N, STAGES>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  Ring<T> ring;
  ring.q = reinterpret_cast<T*>(smem + L::kQOffset);
  ring.k = reinterpret_cast<T*>(smem + L::kKOffset);
  ring.v = reinterpret_cast<T*>(smem + L::kVOffset);
  ring.q_full = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
  ring.q_empty = ring.q_full + 1;
  ring.k_full = ring.q_empty + 1;
  ring.v_full = ring.k_full + STAGES;
  ring.empty = ring.v_full + STAGES;
  ring.tile_of = reinterpret_cast<int*>(smem + L::kTileOffset);
  ring.q_item = ring.tile_of + STAGES;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    constexpr int kConsumerWarps = kConsumers * 4;  // each arrives once per release
    mbarrier_init(ring.q_full, 1);
    mbarrier_init(ring.q_empty, kConsumerWarps);
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(&ring.k_full[s], 1);
      mbarrier_init(&ring.v_full[s], 1);
      mbarrier_init(&ring.empty[s], kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  // 128 x 40 + 256 x 232 registers fill the 64 K of an SM.
  constexpr bool kMoveRegisters = kConsumers == 2;
  if (warp >= kConsumers * 4) {
    if constexpr (kMoveRegisters) warpgroup_registers_release<40>();
    if (warp == kConsumers * 4 && lane == 0) {
      produce<T, D, M, N, STAGES>(&q_map, &k_map, &v_map, a, q_tiles, work_counter, ring);
    }
  } else {
    if constexpr (kMoveRegisters) warpgroup_registers_claim<232>();
    consume<T, D, kConsumers, N, STAGES>(a, q_tiles, ring, warp, lane);
  }
#endif
}

// ---------------------------------------------------------------- host side

// A [batch, heads, len, dim] operand as a 4-D tensor map (innermost first)
// whose box is `rows` x 64 elements with the 128-byte swizzle.
bool encode_operand(CUtensorMap* map, FloatDtype dtype, const void* base, int64_t batch,
                    int64_t heads, int64_t len, int64_t dim, const int64_t (&strides)[4],
                    int rows) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  // No keys at all still launches (every row is empty) but reads nothing; the
  // map must still describe a non-empty tensor.
  len = len > 0 ? len : 1;
  // Batch and head axes of stride 0 (one element, or broadcast with expand)
  // become axes of one element that the kernel always reads at coordinate 0
  // (see `coordinate`); the map needs a real stride for them all the same.
  int64_t bytes[3];
  bytes[0] = strides[2] != 0 ? strides[2] * 2 : dim * 2;
  bytes[1] = strides[1] != 0 ? strides[1] * 2 : len * bytes[0];
  bytes[2] = strides[0] != 0 ? strides[0] * 2 : heads * bytes[1];
  const cuuint64_t sizes[4] = {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(len),
                               static_cast<cuuint64_t>(strides[1] != 0 ? heads : 1),
                               static_cast<cuuint64_t>(strides[0] != 0 ? batch : 1)};
  const cuuint64_t byte_strides[3] = {static_cast<cuuint64_t>(bytes[0]),
                                      static_cast<cuuint64_t>(bytes[1]),
                                      static_cast<cuuint64_t>(bytes[2])};
  const cuuint32_t box[4] = {kPanel, static_cast<cuuint32_t>(rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(
      map, dtype == FloatDtype::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                         : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      4, const_cast<void*>(base), sizes, byte_strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

template <typename T, int D, int kConsumers, int N>
KernelStatus launch(const BlockSparseAttentionArgs& a, int* work_counter, cudaStream_t stream) {
  constexpr int M = 64 * kConsumers;
  // Three stages where they fit in the 227 KiB one CTA may have; 64-row
  // CTAs keep two so that two of them fit on an SM.
  constexpr int kStages =
      kConsumers > 1 && HopperLayout<D, M, N, 3>::kAllocBytes <= 227 * 1024 ? 3 : 2;
  using L = HopperLayout<D, M, N, kStages>;
  const int64_t q_tiles = ceil_div(a.q_len, M);
  const int64_t items = q_tiles * a.batch * a.heads;
  if (items == 0) return KernelStatus::ok();
  if (items > 0x7fffffff) return KernelStatus::invalid("too many query tiles for one grid");
  CUtensorMap q_map, k_map, v_map;
  if (!encode_operand(&q_map, a.dtype, a.q, a.batch, a.heads, a.q_len, D, a.q_strides, M) ||
      !encode_operand(&k_map, a.dtype, a.k, a.batch, a.kv_heads, a.k_len, D, a.k_strides, N) ||
      !encode_operand(&v_map, a.dtype, a.v, a.batch, a.kv_heads, a.k_len, D, a.v_strides, N)) {
    return KernelStatus::invalid("could not describe q, k or v to the tensor copy engine");
  }
  auto kernel = hopper_attention<T, D, kConsumers, N, kStages>;
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
  // tiles when the key block does and both warpgroups share them.
  if (a.block_q % 128 == 0) {
    return a.block_k % 128 == 0 ? launch<T, D, 2, 128>(a, counter, s)
                                : launch<T, D, 2, 64>(a, counter, s);
  }
  return launch<T, D, 1, 64>(a, counter, s);
}

template <typename T>
KernelStatus launch_for_dtype(const BlockSparseAttentionArgs& a, int* counter, cudaStream_t s) {
  return a.head_dim == 64 ? launch_for_blocks<T, 64>(a, counter, s)
                          : launch_for_blocks<T, 128>(a, counter, s);
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
