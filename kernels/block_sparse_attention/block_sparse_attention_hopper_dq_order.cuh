// The fused Hopper backward's dQ: per 64-row query tile, the key tiles
// that visit it add their float32 dQ partials into one accumulator in a
// fixed order (from the last key tile down), so the sum has the same bits
// on every run. Here: the CTA's shared-memory layout with its dQ buffers,
// the order's start (start_dq_order) and its step (next_contributor), the
// writer warps that add the partials (write_dq_partials), and the cast to
// grad_q (store_grad_q). Needs the sm_90a target for the device parts. No
// torch headers.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "block_sparse_attention/block_sparse_attention_hopper_key_tiles.cuh"
#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "block_sparse_attention/block_sparse_attention_tile.cuh"
#include "common/hopper.cuh"

namespace baracuda {

// Shared memory of a fused CTA: that of KeyTileLayout, laid out so that it
// fits, plus two dS^T tiles (the A operand of dQ += dS K, NK key rows of
// 64 query columns each, swizzled as TMA would store them), two dQ
// partials in float32 (the accumulator fragments in register order, as
// they go to global memory), and per partial a full and an empty barrier
// and the words saying where it goes.
template <int D, int NK, int STAGES>
struct FusedKeyTileLayout {
  static constexpr int kStages = STAGES;
  static constexpr int kKVBytes = NK * D * 2;
  static constexpr int kRowBytes = kRowTile * D * 2;
  static constexpr int kDsBytes = NK * kRowTile * 2;
  static constexpr int kDqBytes = kRowTile * D * 4;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKVBytes;
  static constexpr int kQOffset = kVOffset + kKVBytes;
  static constexpr int kDoOffset = kQOffset + STAGES * kRowBytes;
  static constexpr int kDsOffset = kDoOffset + STAGES * kRowBytes;  // 1024-aligned
  static constexpr int kDqOffset = kDsOffset + 2 * kDsBytes;
  static constexpr int kLseOffset = kDqOffset + 2 * kDqBytes;
  static constexpr int kDeltaOffset = kLseOffset + STAGES * kRowTile * 4;
  static constexpr int kBarrierOffset = kDeltaOffset + STAGES * kRowTile * 4;
  static constexpr int kEntryOffset = kBarrierOffset + (2 + 2 * STAGES) * 8;
  static constexpr int kDqBarrierOffset = (kEntryOffset + (2 * STAGES + 1) * 4 + 7) / 8 * 8;
  static constexpr int kDqWhereOffset = kDqBarrierOffset + 4 * 8;  // dq_full[2], dq_empty[2]
  static constexpr int kBytes = kDqWhereOffset + 2 * 4 * 4;
  static constexpr int kAllocBytes = kBytes + 1024;
  static constexpr int kStageTx = 2 * kRowBytes + 2 * kRowTile * 4;
};

// Where a dQ partial goes: query tile q0 of head h in batch b, from the key
// tile kt (its index; the order's turn); q0 = kEndOfWork tells the writer
// to stop.
struct DqWhere {
  int q0, h, b, kt;
};
constexpr int kEndOfWork = -2;

template <typename T>
struct DqBuffers {
  T* ds;         // two NK x 64 tiles
  float* dq;     // two 64 x D partials
  uint64_t *full, *empty;
  DqWhere* where;
};

template <typename T, typename Layout>
__device__ inline DqBuffers<T> carve_dq_buffers(unsigned char* smem_raw) {
  unsigned char* smem = swizzle_aligned(smem_raw);
  DqBuffers<T> d;
  d.ds = reinterpret_cast<T*>(smem + Layout::kDsOffset);
  d.dq = reinterpret_cast<float*>(smem + Layout::kDqOffset);
  d.full = reinterpret_cast<uint64_t*>(smem + Layout::kDqBarrierOffset);
  d.empty = d.full + 2;
  d.where = reinterpret_cast<DqWhere*>(smem + Layout::kDqWhereOffset);
  return d;
}

// The next key tile after kt (from the last down) whose walk visits the
// query tile at q0 of head h in batch b, or -1: one candidate per lane,
// kt - 1 - lane, 32 at a time. Rows [begin, end) of key tiles only move
// forward with the tile, so a candidate whose rows end at or before q0
// ends the search.
__device__ inline int next_contributor(const BlockSparseAttentionArgs& a, int64_t b, int64_t h,
                                       int64_t q0, int kt, int nk, int lane) {
  for (int base = kt - 1; base >= 0; base -= 32) {
    const int cand = base - lane;
    bool visits = false, ends = cand < 0;
    if (!ends) {
      int64_t begin, end;
      key_tile_rows(a, b, int64_t{cand} * nk, nk, begin, end);
      ends = end <= q0;
      visits = !ends && walk_visits(a, b, h, int64_t{cand} * nk, nk, q0);
    }
    const uint32_t visit_lanes = __ballot_sync(0xffffffffu, visits);
    const uint32_t end_lanes = __ballot_sync(0xffffffffu, ends);
    const int first_visit = visit_lanes ? __ffs(visit_lanes) - 1 : 32;
    const int first_end = end_lanes ? __ffs(end_lanes) - 1 : 32;
    if (first_visit < first_end) return base - first_visit;
    if (first_end < 32) return -1;
  }
  return -1;
}

// A dQ writer warp of a fused CTA, one per partial buffer `buf`: adds each
// dQ partial into the float32 accumulator of its query tile, in L2, once
// the tile's order says it is this key tile's turn (dq_order[tile] == kt),
// then passes the turn on to the next key tile that visits the query tile
// (found while waiting). The add is complete before the turn moves, so
// every query tile sums its partials in one order: the same bits on every
// run. Two writers, so that one's wait for its turn overlaps the other's
// add.
template <typename T, int D, int NK>
__device__ inline void write_dq_partials(const BlockSparseAttentionBackwardArgs& ba,
                                         const DqBuffers<T>& dqb, int buf, int lane) {
  const BlockSparseAttentionArgs& a = ba.forward;
  const int64_t tiles_per_head = ba.rows_stride / kRowTile;
  float* accum = static_cast<float*>(ba.dq_accum);
  for (int n = 0;; ++n) {
    mbarrier_wait(&dqb.full[buf], n & 1);
    const volatile DqWhere* where = &dqb.where[buf];
    const DqWhere w{where->q0, where->h, where->b, where->kt};
    if (w.q0 == kEndOfWork) break;
    const int64_t tile = (int64_t{w.b} * a.heads + w.h) * tiles_per_head + w.q0 / kRowTile;
    int* turn = ba.dq_order + tile;
    const int next = next_contributor(a, w.b, w.h, w.q0, w.kt, NK, lane);
    if (lane == 0) {
      while (load_acquire(turn) != w.kt) {
      }
      fence_proxy_async();
      bulk_reduce_add_to_global(accum + tile * kRowTile * D, dqb.dq + buf * kRowTile * D,
                                kRowTile * D * 4);
      bulk_store_wait_read();
      mbarrier_arrive(&dqb.empty[buf]);  // the partial is read: the consumers may refill it
      bulk_store_wait_all();
      fence_proxy_async();
      store_release(turn, next);
    }
    __syncwarp();
  }
}

// The first key tile (from the last down) whose walk visits each 64-row
// query tile, the start of that tile's dQ order (-1: none, dQ = 0). One
// thread per query tile of every (batch, head).
template <int NK>
__global__ void start_dq_order(const BlockSparseAttentionBackwardArgs ba) {
  const BlockSparseAttentionArgs& a = ba.forward;
  const int64_t tiles_per_head = ba.rows_stride / kRowTile;
  const int64_t tile = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (tile >= a.batch * a.heads * tiles_per_head) return;
  const int64_t bh = tile / tiles_per_head, q0 = tile % tiles_per_head * kRowTile;
  const int64_t b = bh / a.heads, h = bh % a.heads;
  int first = -1;
  for (int64_t kt = (keys_of(a, b) + NK - 1) / NK - 1; kt >= 0; --kt) {
    int64_t begin, end;
    key_tile_rows(a, b, kt * NK, NK, begin, end);
    if (end <= q0) break;  // no earlier key tile reaches the query tile either
    if (walk_visits(a, b, h, kt * NK, NK, q0)) {
      first = static_cast<int>(kt);
      break;
    }
  }
  ba.dq_order[tile] = first;
}

// grad_q = scale * the accumulated dQ of each 64-row query tile, from the
// register order the fused kernel's partials are in: float4 j of thread t
// of column half w (128 threads, warp t / 32, lane l; D / 64 halves) holds
// rows 16 (t / 32) + l / 4 and + 8, columns 64 w + 8 j + 2 (l % 4) and + 1.
// One thread per (half, t).
template <typename T, int D>
__global__ void __launch_bounds__(256) store_grad_q(const BlockSparseAttentionBackwardArgs ba) {
  const BlockSparseAttentionArgs& a = ba.forward;
  const int64_t q_tiles = (a.q_len + kRowTile - 1) / kRowTile;
  const int64_t bh = blockIdx.x / q_tiles, q0 = blockIdx.x % q_tiles * kRowTile;
  const int64_t tile = bh * (ba.rows_stride / kRowTile) + q0 / kRowTile;
  const int half = threadIdx.x / 128, t = threadIdx.x % 128, lane = t % 32;
  const float4* in = reinterpret_cast<const float4*>(static_cast<const float*>(ba.dq_accum) +
                                                     tile * kRowTile * D) +
                     half * 8 * 128 + t;
  T* out = static_cast<T*>(ba.grad_q) + (bh * a.q_len + q0) * D;
  const float scale = static_cast<float>(a.scale);
  const int row = 16 * (t / 32) + lane / 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 v = in[j * 128];
    const int col = 64 * half + 8 * j + 2 * (lane % 4);
    if (q0 + row < a.q_len) {
      *reinterpret_cast<uint32_t*>(out + row * D + col) = pack2<T>(v.x * scale, v.y * scale);
    }
    if (q0 + row + 8 < a.q_len) {
      *reinterpret_cast<uint32_t*>(out + (row + 8) * D + col) = pack2<T>(v.z * scale, v.w * scale);
    }
  }
}

}  // namespace baracuda
