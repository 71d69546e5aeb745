// Pieces of the Hopper (wgmma + TMA) attention executors that the forward
// and the backward share: the shared-memory ring of a persistent CTA, the
// producer that streams a query tile's key tiles into it, the warpgroup MMA
// issues over 128-byte swizzled tiles, and the tensor maps of the operands.
//
// Tiles are stored as TMA writes them with the 128-byte swizzle: a tile of
// `rows` x D is D / 64 panels of rows x 64 elements (128-byte rows, 8-row
// groups 1024 bytes apart), which is the layout the wgmma descriptors name.
// Needs the sm_90a target for the device parts. No torch headers.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "block_sparse_attention/block_sparse_attention_tile.cuh"
#include "common/hopper.cuh"
#include "common/tensor_map.h"
#include "common/wgmma_ops.cuh"

namespace baracuda {

constexpr int kPanel = 64;  // elements per 128-byte swizzled row

// Calls fn(std::integral_constant<int, L>{}) for the level `tests` of
// per-element tests (kTestsNone, kTestsBits, kTestsDocuments): how a
// launcher picks the kernel instantiation of a problem.
template <typename Fn>
inline auto dispatch_element_tests(int tests, Fn&& fn) {
  if (tests == kTestsDocuments) return fn(std::integral_constant<int, kTestsDocuments>{});
  if (tests == kTestsBits) return fn(std::integral_constant<int, kTestsBits>{});
  return fn(std::integral_constant<int, kTestsNone>{});
}

// Threads of a CTA: the consumer warpgroups, then a producer warpgroup when
// registers move between them (two consumers), else a single producer warp.
template <int kConsumers>
constexpr int hopper_threads() {
  return kConsumers == 2 ? 3 * 128 : kConsumers * 128 + 32;
}

// kQOperands tiles of M x D ride with each work item (the forward's Q; the
// backward's Q and dO, one after the other in the Q buffer).
template <int D, int M, int N, int STAGES, int kQOperands = 1>
struct HopperLayout {
  static constexpr int kStages = STAGES;
  static constexpr int kQBytes = kQOperands * M * D * 2;
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

// A CTA's dynamic shared memory rounded up to 1024 bytes, the alignment the
// 128-byte swizzled tiles need (the allocation only guarantees 16; each
// layout's kAllocBytes leaves room for the rounding).
__device__ inline unsigned char* swizzle_aligned(unsigned char* smem_raw) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                          ~uintptr_t{1023});
}

// The shared memory of a CTA. Stage s of the ring holds one K and one V
// tile; k_full[s] completes when its K tile has landed (and tile_of[s], the
// producer's word on that entry, is written), v_full[s] when its V tile has,
// and empty[s] when every consumer warp is done with both. q_full completes
// when the Q tile (tiles) of work item *q_item (or -1: no more work) is in,
// q_empty when every consumer warp has issued its last MMA that reads it.
template <typename T>
struct Ring {
  T *q, *k, *v;
  uint64_t *q_full, *q_empty, *k_full, *v_full, *empty;
  int *tile_of, *q_item;
};

// The ring in a CTA's dynamic shared memory, laid out as Layout says.
template <typename T, typename Layout>
__device__ inline Ring<T> carve_ring(unsigned char* smem_raw) {
  unsigned char* smem = swizzle_aligned(smem_raw);
  constexpr int kStages = Layout::kStages;
  Ring<T> ring;
  ring.q = reinterpret_cast<T*>(smem + Layout::kQOffset);
  ring.k = reinterpret_cast<T*>(smem + Layout::kKOffset);
  ring.v = reinterpret_cast<T*>(smem + Layout::kVOffset);
  ring.q_full = reinterpret_cast<uint64_t*>(smem + Layout::kBarrierOffset);
  ring.q_empty = ring.q_full + 1;
  ring.k_full = ring.q_empty + 1;
  ring.v_full = ring.k_full + kStages;
  ring.empty = ring.v_full + kStages;
  ring.tile_of = reinterpret_cast<int*>(smem + Layout::kTileOffset);
  ring.q_item = ring.tile_of + kStages;
  return ring;
}

// Initialises the ring's barriers (one thread, before a block-wide barrier):
// the consumer warps each arrive once per release.
template <typename T>
__device__ inline void init_ring(const Ring<T>& ring, int stages, int consumer_warps) {
  mbarrier_init(ring.q_full, 1);
  mbarrier_init(ring.q_empty, consumer_warps);
  for (int s = 0; s < stages; ++s) {
    mbarrier_init(&ring.k_full[s], 1);
    mbarrier_init(&ring.v_full[s], 1);
    mbarrier_init(&ring.empty[s], consumer_warps);
  }
  mbarrier_init_fence();
}

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

// Zeroes rows [first_row, N) of an N x D tile in the 128-byte swizzled
// layout (whole 128-byte rows, which the swizzle permutes only within
// themselves) for the MMAs of warpgroup `wg`, which all of its 128 threads
// call. The zeros reach the tensor cores through the async proxy, ordered
// by the fence and the warpgroup's barrier. Another warpgroup zeroing the
// same rows at the same time writes the same zeros.
template <typename T, int D, int N>
__device__ inline void zero_rows_from(T* tile, int first_row, int wg) {
  if (first_row < 0) first_row = 0;
  constexpr int kChunks = kPanel * 2 / 16;  // 16-byte chunks per 128-byte row
  // Chunk idx of the tile: panel idx / (N kChunks), then row, then chunk.
  for (int idx = first_row * kChunks + threadIdx.x % 128; idx < (D / kPanel) * N * kChunks;
       idx += 128) {
    if (idx % (N * kChunks) >= first_row * kChunks) {
      *reinterpret_cast<uint4*>(tile + idx * 8) = make_uint4(0, 0, 0, 0);
    }
  }
  fence_proxy_async_shared();
  // Immediate barrier ids: a register id would make ptxas reserve all 16.
  if (wg == 0) {
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
  } else {
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
  }
}

// What the producer publishes in tile_of[stage] with each ring entry: a key
// tile index, flagged when it is the work item's last, or kNoTile for an
// item that visits no key tile at all (the entry then carries no data).
constexpr int kLastTile = 1 << 30;
constexpr int kNoTile = -1;

// A producer's place in a ring of STAGES stages: next() hands out the next
// stage once the consumers have freed its previous use (empty[stage]).
template <int STAGES>
struct StageCursor {
  uint64_t* empty;
  int it = 0;  // ring entries filled so far

  __device__ int next() {
    const int stage = it % STAGES;
    if (it >= STAGES) mbarrier_wait(&empty[stage], ((it / STAGES) - 1) & 1);
    ++it;
    return stage;
  }
};

// Tells the consumers there is no work item after item n - 1: once they
// are done with its per-item tiles (item_empty), item -1 is published
// through item_full (the arrival has release semantics).
__device__ inline void publish_end(uint64_t* item_full, uint64_t* item_empty, int* item_slot,
                                   int n) {
  if (n > 0) mbarrier_wait(item_empty, (n - 1) & 1);
  *item_slot = -1;
  mbarrier_arrive(item_full);
}

// The query-side operands a work item loads once: tensor maps, and the
// [batch, heads, len, dim] strides (in elements, kernel arguments) their
// coordinates follow.
template <int kQOperands>
struct QueryOperands {
  const CUtensorMap* map[kQOperands];
  const int64_t* strides[kQOperands];
};

// The producer thread: takes work items (query tiles, in query_tile's order)
// until none is left, first its CTA's own and then from the shared counter,
// so that CTAs that drew light items take more. Per item it hands over the
// first key tile, loads the query-side tiles once the previous item's MMAs
// on them are done, then streams the remaining K/V tiles into the ring; an
// item of index -1 tells the consumers to stop.
template <typename T, int D, int M, int N, int STAGES, int kQOperands>
__device__ inline void produce(const QueryOperands<kQOperands>& query, const CUtensorMap* k_map,
                               const CUtensorMap* v_map, const BlockSparseAttentionArgs& a,
                               int64_t q_tiles, int* work_counter, const Ring<T>& ring) {
  using L = HopperLayout<D, M, N, STAGES, kQOperands>;
  constexpr int kPanels = D / kPanel;
  const int64_t items = q_tiles * a.batch * a.heads * a.kv_splits;
  int64_t item = blockIdx.x;
  StageCursor<STAGES> stages{ring.empty};
  auto next_stage = [&] { return stages.next(); };
  for (int n = 0;; ++n) {
    if (item >= items) return publish_end(ring.q_full, ring.q_empty, ring.q_item, n);
    const QueryTile qt = query_tile(a, item, q_tiles, M);
    const int kh = coordinate(qt.kv_head, a.k_strides[1]), kb = coordinate(qt.b, a.k_strides[0]);
    const int vh = coordinate(qt.kv_head, a.v_strides[1]), vb = coordinate(qt.b, a.v_strides[0]);
    KeyTileWalk walk(a, qt, N);
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
    *ring.q_item = static_cast<int>(item);
    mbarrier_arrive_expect_tx(ring.q_full, L::kQBytes);
#pragma unroll
    for (int o = 0; o < kQOperands; ++o) {
      const int qh = coordinate(qt.h, query.strides[o][1]);
      const int qb = coordinate(qt.b, query.strides[o][0]);
      for (int p = 0; p < kPanels; ++p) {
        tma_load_4d(ring.q + o * M * D + p * M * kPanel, query.map[o], p * kPanel,
                    static_cast<int>(qt.q0), qh, qb, ring.q_full);
      }
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

// ---------------------------------------------------------------- host side

// A [batch, heads, len, dim] operand as a 4-D tensor map (innermost first)
// whose box is `rows` x 64 elements with the 128-byte swizzle.
inline bool encode_operand(CUtensorMap* map, FloatDtype dtype, const void* base, int64_t batch,
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

}  // namespace baracuda
