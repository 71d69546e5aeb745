// The key side of the Hopper attention backward: a work item is NK keys of
// one (batch, key head), whose K and V tiles stay in shared memory while a
// producer thread streams the 64-row query tiles that see them (the mask's
// column, read in place) with their dO tile and per-row scratch. The
// dK / dV kernel and the fused pass of
// block_sparse_attention_hopper_backward.cu both run on it. Needs the
// sm_90a target for the device parts. No torch headers.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "block_sparse_attention/block_sparse_attention_hopper.cuh"
#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "common/hopper.cuh"

namespace baracuda {

constexpr int kRowTile = 64;  // query rows per streamed tile of the key side

// Shared memory of a dK / dV CTA: the item's K and V tiles, then per stage
// a query tile, its dO tile and their 64 rows' lse (log2) and delta.
template <int D, int NK, int STAGES>
struct KeyTileLayout {
  static constexpr int kStages = STAGES;
  static constexpr int kKVBytes = NK * D * 2;          // K or V of the item
  static constexpr int kRowBytes = kRowTile * D * 2;   // Q or dO of a stage
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKVBytes;
  static constexpr int kQOffset = kVOffset + kKVBytes;
  static constexpr int kDoOffset = kQOffset + STAGES * kRowBytes;
  static constexpr int kLseOffset = kDoOffset + STAGES * kRowBytes;
  static constexpr int kDeltaOffset = kLseOffset + STAGES * kRowTile * 4;
  // kv_full, kv_empty, then full and empty per stage.
  static constexpr int kBarrierOffset = kDeltaOffset + STAGES * kRowTile * 4;
  static constexpr int kEntryOffset = kBarrierOffset + (2 + 2 * STAGES) * 8;
  static constexpr int kBytes = kEntryOffset + (2 * STAGES + 1) * 4;  // tile_of, head_of, kv_item
  static constexpr int kAllocBytes = kBytes + 1024;  // room to round the base up to 1024
  static constexpr int kStageTx = 2 * kRowBytes + 2 * kRowTile * 4;
};

// kv_full completes when the K and V tiles of item *kv_item (or -1: no more
// work) are in, kv_empty when every consumer warp is done with them. Stage
// s holds the query tile of row tile_of[s] (flagged kLastTile on an item's
// last entry, kNoTile for an item with none) of head head_of[s]; full[s]
// completes when all of it has landed, empty[s] when every consumer warp
// is done with it.
template <typename T>
struct KeyTileRing {
  T *k, *v, *q, *dout;
  float *lse, *delta;
  uint64_t *kv_full, *kv_empty, *full, *empty;
  int *tile_of, *head_of, *kv_item;
};

template <typename T, typename Layout>
__device__ inline KeyTileRing<T> carve_key_tile_ring(unsigned char* smem_raw) {
  unsigned char* smem = swizzle_aligned(smem_raw);
  constexpr int kStages = Layout::kStages;
  KeyTileRing<T> r;
  r.k = reinterpret_cast<T*>(smem + Layout::kKOffset);
  r.v = reinterpret_cast<T*>(smem + Layout::kVOffset);
  r.q = reinterpret_cast<T*>(smem + Layout::kQOffset);
  r.dout = reinterpret_cast<T*>(smem + Layout::kDoOffset);
  r.lse = reinterpret_cast<float*>(smem + Layout::kLseOffset);
  r.delta = reinterpret_cast<float*>(smem + Layout::kDeltaOffset);
  r.kv_full = reinterpret_cast<uint64_t*>(smem + Layout::kBarrierOffset);
  r.kv_empty = r.kv_full + 1;
  r.full = r.kv_empty + 1;
  r.empty = r.full + kStages;
  r.tile_of = reinterpret_cast<int*>(smem + Layout::kEntryOffset);
  r.head_of = r.tile_of + kStages;
  r.kv_item = r.head_of + kStages;
  return r;
}

// The key tile of work item `item`. Two orders:
// - the dK / dV kernel's: items run through the key tiles of a (batch, key
//   head) innermost, so the CTAs at work at one time read the query tiles
//   of the same few heads (from L2); with causal attention the first key
//   tiles (the most query tiles) go first;
// - the fused kernel's (kOrdered): the same, but from the last key tile
//   down, kPairsInFlight (batch, key head) pairs interleaved. Its dQ
//   partials are added to a query tile in that order, each after the one
//   before it (which an earlier item holds, so the waits cannot close a
//   cycle); from the last tile down, causal and window walks reach a query
//   tile just after the tile before them in the order, and pairs in flight
//   side by side let one pair's items run while another's wait. A sparse
//   mask's order chains a query tile's few key tiles from across the whole
//   pair, so it needs several pairs in flight to keep the SMs busy (on the
//   H200, random 10 % tiles at L 8192: 1.7x faster with eight than with
//   two); past eight, the pairs' query-side tiles and accumulators no
//   longer stay in L2 and dense attention slows.
constexpr int64_t kPairsInFlight = 8;

struct KeyTile {
  int64_t b, g, k0;
};

template <bool kOrdered>
__device__ inline KeyTile key_tile(const BlockSparseAttentionArgs& a, int64_t item,
                                   int64_t k_tiles, int nk) {
  if constexpr (kOrdered) {
    const int64_t pairs = a.batch * a.kv_heads;
    const int64_t first_pair = item / (k_tiles * kPairsInFlight) * kPairsInFlight;
    const int64_t width = min(kPairsInFlight, pairs - first_pair);
    const int64_t r = item % (k_tiles * kPairsInFlight);
    const int64_t bg = first_pair + r % width;
    return {bg / a.kv_heads, bg % a.kv_heads, (k_tiles - 1 - r / width) * nk};
  } else {
    const int64_t bg = item / k_tiles;
    return {bg / a.kv_heads, bg % a.kv_heads, (item % k_tiles) * nk};
  }
}

// The rows [begin, end) that may see one of the keys [k0, k0 + nk) of
// batch b by position: row ranges only move forward with the key, so the
// first key's start and the last real key's end bound them (none for a
// tile past the batch's keys). Both ends only move forward with k0.
__device__ inline void key_tile_rows(const BlockSparseAttentionArgs& a, int64_t b, int64_t k0,
                                     int nk, int64_t& begin, int64_t& end) {
  begin = end = 0;
  const int64_t keys = keys_of(a, b);
  if (k0 < keys) {
    int64_t unused;
    visible_row_range(a, b, k0, begin, unused);
    visible_row_range(a, b, min(k0 + nk, keys) - 1, unused, end);
  }
}

// The query tiles that see a key tile of nk keys, in order: for each query
// head of the group, the 64-row tiles of the query blocks whose mask byte
// for the key block is on, among the rows that may see one of the tile's
// keys by position (with top-left causal, rows from the tile's first key
// on). Every call reads the same mask bytes, so the walk is uniform. A
// position is (head offset in the group, query row of the tile); `next`
// gives the one after it, or hl == group at the end.
struct QueryTileWalk {
  const BlockSparseAttentionArgs& a;
  KeyTile t;
  int64_t group, kb;
  int64_t row_begin = 0, row_end = 0;

  __device__ QueryTileWalk(const BlockSparseAttentionArgs& args, const KeyTile& tile, int nk)
      : a(args), t(tile), group(args.heads / args.kv_heads), kb(tile.k0 / args.block_k) {
    key_tile_rows(args, tile.b, tile.k0, nk, row_begin, row_end);
  }

  // First visible tile at or after (hl, q0).
  __device__ void seek(int64_t& hl, int64_t& q0) const {
    const int64_t first_q0 = row_begin / kRowTile * kRowTile;
    if (q0 < first_q0) q0 = first_q0;
    while (hl < group) {
      const uint8_t* column_head = mask_row(a, t.b, t.g * group + hl, 0);
      while (q0 < row_end) {
        const int64_t qb = q0 / a.block_q;
        if (key_block_on(a, column_head + qb * a.mask_strides[2], kb)) return;
        q0 = (qb + 1) * a.block_q;
      }
      ++hl;
      q0 = first_q0;
    }
  }
  __device__ void first(int64_t& hl, int64_t& q0) const {
    hl = 0;
    q0 = 0;
    seek(hl, q0);
  }
  __device__ void next(int64_t& hl, int64_t& q0) const {
    q0 += kRowTile;
    seek(hl, q0);
  }
};

// Whether the walk of the key tile at k0 (nk keys) of batch b visits the
// query tile at q0 of head h: QueryTileWalk's rule for one tile, which the
// fused kernel's dQ order follows.
__device__ inline bool walk_visits(const BlockSparseAttentionArgs& a, int64_t b, int64_t h,
                                   int64_t k0, int nk, int64_t q0) {
  int64_t begin, end;
  key_tile_rows(a, b, k0, nk, begin, end);
  return q0 >= begin / kRowTile * kRowTile && q0 < end &&
         key_block_on(a, mask_row(a, b, h, q0 / a.block_q), k0 / a.block_k);
}

template <typename T, int D, int NK, typename L, bool kOrdered>
__device__ inline void produce_key_tiles(const CUtensorMap* q_map, const CUtensorMap* do_map,
                                         const CUtensorMap* k_map, const CUtensorMap* v_map,
                                         const BlockSparseAttentionBackwardArgs& ba,
                                         int64_t k_tiles, int* work_counter,
                                         const KeyTileRing<T>& ring) {
  constexpr int STAGES = L::kStages;
  constexpr int kPanels = D / kPanel;
  const BlockSparseAttentionArgs& a = ba.forward;
  const int64_t items = k_tiles * a.batch * a.kv_heads;
  int64_t item = blockIdx.x;
  StageCursor<STAGES> stages{ring.empty};
  auto next_stage = [&] { return stages.next(); };
  for (int n = 0;; ++n) {
    if (item >= items) return publish_end(ring.kv_full, ring.kv_empty, ring.kv_item, n);
    const KeyTile kt = key_tile<kOrdered>(a, item, k_tiles, NK);
    const QueryTileWalk walk(a, kt, NK);
    int64_t hl, q0;
    walk.first(hl, q0);
    // One ring entry: the query tile at (hl, q0), and the walk moved past it.
    auto push_entry = [&] {
      int64_t next_hl = hl, next_q0 = q0;
      walk.next(next_hl, next_q0);
      const int stage = next_stage();
      const int64_t h = kt.g * walk.group + hl;
      ring.tile_of[stage] = static_cast<int>(q0) | (next_hl >= walk.group ? kLastTile : 0);
      ring.head_of[stage] = static_cast<int>(h);
      uint64_t* bar = &ring.full[stage];
      mbarrier_arrive_expect_tx(bar, L::kStageTx);
      const int qh = coordinate(h, a.q_strides[1]), qbat = coordinate(kt.b, a.q_strides[0]);
      const int oh = coordinate(h, ba.grad_out_strides[1]);
      const int obat = coordinate(kt.b, ba.grad_out_strides[0]);
      T* q_dst = ring.q + stage * kRowTile * D;
      T* do_dst = ring.dout + stage * kRowTile * D;
      for (int p = 0; p < kPanels; ++p) {
        tma_load_4d(q_dst + p * kRowTile * kPanel, q_map, p * kPanel, static_cast<int>(q0), qh,
                    qbat, bar);
        tma_load_4d(do_dst + p * kRowTile * kPanel, do_map, p * kPanel, static_cast<int>(q0), oh,
                    obat, bar);
      }
      const int64_t row = (kt.b * a.heads + h) * ba.rows_stride + q0;
      bulk_copy_to_shared(ring.lse + stage * kRowTile, static_cast<const float*>(ba.lse_log2) + row,
                          kRowTile * 4, bar);
      bulk_copy_to_shared(ring.delta + stage * kRowTile,
                          static_cast<const float*>(ba.delta) + row, kRowTile * 4, bar);
      hl = next_hl;
      q0 = next_q0;
    };
    // The first entry goes out before K and V: its loads do not wait for the
    // consumers to finish the previous item.
    if (hl >= walk.group) {
      const int stage = next_stage();
      ring.tile_of[stage] = kNoTile;
      mbarrier_arrive(&ring.full[stage]);
    } else {
      push_entry();
    }
    if (n > 0) mbarrier_wait(ring.kv_empty, (n - 1) & 1);
    *ring.kv_item = static_cast<int>(item);
    mbarrier_arrive_expect_tx(ring.kv_full, 2 * L::kKVBytes);
    const int kh = coordinate(kt.g, a.k_strides[1]), kbat = coordinate(kt.b, a.k_strides[0]);
    const int vh = coordinate(kt.g, a.v_strides[1]), vbat = coordinate(kt.b, a.v_strides[0]);
    for (int p = 0; p < kPanels; ++p) {
      tma_load_4d(ring.k + p * NK * kPanel, k_map, p * kPanel, static_cast<int>(kt.k0), kh, kbat,
                  ring.kv_full);
      tma_load_4d(ring.v + p * NK * kPanel, v_map, p * kPanel, static_cast<int>(kt.k0), vh, vbat,
                  ring.kv_full);
    }
    while (hl < walk.group) push_entry();
    // Claimed now, while the consumers still work on this item.
    item = int64_t{gridDim.x} + atomicAdd(work_counter, 1);
  }
}

}  // namespace baracuda
