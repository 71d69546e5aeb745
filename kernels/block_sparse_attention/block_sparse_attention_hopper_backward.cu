// Hopper executor of block-sparse attention's backward pass (float16 /
// bfloat16, head_dim == v_dim in {64, 128}, block_q and block_k multiples of
// 64): warpgroup MMAs fed by the tensor copy engine, float32 accumulation,
// deterministic (the same bits on every run). Two persistent kernels, each
// writing every gradient element it owns once; at D = 128 with key blocks
// of a multiple of 128, one fused pass instead (below), whose dQ partials
// add up in a fixed order:
//
// dK / dV: a work item is NK = 64 kConsumers keys of one (batch, key head),
// all in one key block. Its K and V tiles stay in shared memory while the
// producer streams, for each query head of the group, the 64-row query
// tiles of the query blocks whose mask byte for that key block is on (the
// mask's column, read in place), with their dO tile and per-row scratch
// (lse in log2 units, delta). A consumer warpgroup owns 64 of the keys; per
// query tile it computes
//   S^T = K Q^T, dP^T = V dO^T                 wgmma, both from shared memory
//   P^T = 2^(S^T scale log2(e) - lse), dS^T = P^T (dP^T - delta)
//   dV += P^T dO, dK += dS^T Q                 wgmma, P^T / dS^T from registers
// and writes dK (times the scale) and dV once the walk ends.
//
// dQ: a work item is a query tile, as in the forward, whose producer (the
// forward's) brings Q and dO once and streams the visible 64-key tiles; per
// key tile a consumer warpgroup computes S = Q K^T and dP = dO V^T, then
// dS = P (dP - delta) and dQ += dS K.
//
// Fused: the dK / dV kernel with 128-key items, which also computes each
// query tile's dQ = dS K over its keys (dS^T through shared memory) and
// hands it, as a float32 partial, to a writer warp that adds it into the
// query tile's float32 accumulator once the tile's order (dq_order: the
// key tiles that visit it, from the last down) reaches this key tile. Five
// matrix products per (query tile, key tile) instead of seven.
//
// Rows past q_len read as zeros with lse = +inf (the scratch's padding), so
// their P is 0; keys past k_len are masked in dQ and, in dK / dV, only
// reach rows that are never stored. Position conditions (kv_lens, windows,
// bottom-right causal) bound both walks and are tested per element; rows of
// K and V past a batch's kv_lens are cache junk, zeroed in shared memory
// before dQ's MMAs read them and given dS = 0 in dK / dV. The bits of an
// exact mask's partial tiles are read per element by both kernels.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "block_sparse_attention/block_sparse_attention_hopper.cuh"
#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "block_sparse_attention/block_sparse_attention_tile.cuh"
#include "common/cuda_launch.cuh"
#include "common/fast_exp2.h"
#include "common/hopper.cuh"
#include "common/tensor_map.h"
#include "common/wgmma_ops.cuh"

namespace baracuda {
namespace {

constexpr int kRowTile = 64;  // query rows per streamed tile of the dK / dV kernel
constexpr int kKeyTile = 64;  // keys per streamed tile of the dQ kernel

// ---------------------------------------------------------------- dK / dV

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
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
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
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  DqBuffers<T> d;
  d.ds = reinterpret_cast<T*>(smem + Layout::kDsOffset);
  d.dq = reinterpret_cast<float*>(smem + Layout::kDqOffset);
  d.full = reinterpret_cast<uint64_t*>(smem + Layout::kDqBarrierOffset);
  d.empty = d.full + 2;
  d.where = reinterpret_cast<DqWhere*>(smem + Layout::kDqWhereOffset);
  return d;
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

// One consumer warpgroup's 64 keys of every work item: the walk over the
// item's query tiles, then the dK / dV store. kTests: from kTestsBits up,
// position conditions (kv_lens, windows, bottom-right causal) and
// exact-mask bits are tested per element, at kTestsDocuments document ids
// too; at kTestsNone only top-left causal is, in fewer registers (the
// general test spills in the D = 64 kernel, which two CTAs share an SM).
//
// kFused (two consumers, D = 128): per query tile the warpgroups also put
// dS^T into shared memory, and each computes dQ = dS K for its 64 of the
// D columns over all NK keys (K from the item's tile), which goes to the
// dQ writer as a float32 partial.
template <typename T, int D, int kConsumers, int STAGES, int kTests, bool kFused>
__device__ inline void consume_key_tiles(const BlockSparseAttentionBackwardArgs& ba,
                                         int64_t k_tiles, const KeyTileRing<T>& ring,
                                         const DqBuffers<T>& dqb, int warp, int lane) {
  constexpr int NK = 64 * kConsumers;
  constexpr int kCols = kRowTile / 8;  // 8-column groups of S^T
  static_assert(!kFused || (kConsumers == 2 && D == 128), "the fused kernel splits D = 128 in two");
  const BlockSparseAttentionArgs& a = ba.forward;
  const int wg = warp / 4, wg_warp = warp % 4;
  const int g = lane >> 2, t4 = lane & 3;
  const float scale_log2 = static_cast<float>(a.scale) * kLog2e;
  const T* k_rows = ring.k + wg * 64 * kPanel;
  const T* v_rows = ring.v + wg * 64 * kPanel;
  float s[kRowTile / 2], dp[kRowTile / 2];
  uint32_t pt[kRowTile / 16][4], dst[kRowTile / 16][4];
  int it = 0;
  int partials = 0;  // dQ partials handed to the writer (kFused)
  auto release = [&](uint64_t* bar) {
    if (lane == 0) mbarrier_arrive(bar);
  };
  // The next dQ partial buffer, once the writer is done with its last use.
  auto next_partial = [&] {
    const int buf = partials % 2;
    if (partials >= 2) mbarrier_wait(&dqb.empty[buf], ((partials / 2) - 1) & 1);
    ++partials;
    return buf;
  };
  for (int n = 0;; ++n) {
    mbarrier_wait(ring.kv_full, n & 1);
    const int item = *reinterpret_cast<volatile int*>(ring.kv_item);
    if (item < 0) {
      if constexpr (kFused) {
        // Both writers stop at their buffer's next use.
        for (int w = 0; w < 2; ++w) {
          const int buf = next_partial();
          if (warp == 0 && lane == 0) dqb.where[buf].q0 = kEndOfWork;
          __syncwarp();
          release(&dqb.full[buf]);
        }
      }
      break;
    }
    const KeyTile kt = key_tile<kFused>(a, item, k_tiles, NK);
    const int64_t key_g = kt.k0 + wg * 64 + wg_warp * 16 + g;  // keys key_g and key_g + 8
    // The rows [full_lo, full_hi) that see every one of this warpgroup's 64
    // keys by position: a query tile inside them needs no per-element test.
    // (Ranges only move forward with the key, so the last key's start and
    // the first key's end bound them; none if a key is past the batch's.)
    int full_lo = 1, full_hi = 0;
    if constexpr (kTests != kTestsNone) {
      const int64_t first_key = kt.k0 + wg * 64, last_key = first_key + 63;
      if (last_key < keys_of(a, kt.b)) {
        int64_t lo, hi, unused;
        visible_row_range(a, kt.b, last_key, lo, unused);
        visible_row_range(a, kt.b, first_key, unused, hi);
        full_lo = static_cast<int>(lo);
        full_hi = static_cast<int>(hi);
      }
    }
    if constexpr (kFused) {
      // dQ = dS K multiplies dS = 0 by the K rows of keys past the batch's
      // kv_lens, the cache's junk (NaN, say): zeroed before any MMA reads
      // the tile. Each warpgroup's dQ reads both halves, ordered by the
      // warpgroups' barrier before the first one.
      if (a.kv_lens != nullptr) {
        const int first_junk = static_cast<int>(keys_of(a, kt.b) - kt.k0);
        if (first_junk < NK) zero_rows_from<T, D, NK>(ring.k, first_junk, wg);
      }
    }
    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
    for (;;) {
      const int stage = it % STAGES;
      mbarrier_wait(&ring.full[stage], (it / STAGES) & 1);
      ++it;
      const int entry = *reinterpret_cast<volatile int*>(&ring.tile_of[stage]);
      if (entry == kNoTile) {
        release(&ring.empty[stage]);
        break;
      }
      const int64_t q0 = entry & ~kLastTile;
      int64_t h = 0;
      if constexpr (kFused || kTests != kTestsNone) {
        h = *reinterpret_cast<volatile int*>(&ring.head_of[stage]);
      }
      const T* qs = ring.q + stage * kRowTile * D;
      const T* dos = ring.dout + stage * kRowTile * D;
      wgmma_fence();
      issue_scores<T, D, NK, kRowTile>(s, k_rows, qs);
      issue_scores<T, D, NK, kRowTile>(dp, v_rows, dos);
      wgmma_wait<0>();
      register_fence(s);
      register_fence(dp);
      // Row r = e >> 1 of a pair is key key_g + 8 r; column 8 j + 2 t4 + (e & 1)
      // is query row q0 + that column.
      const float* lse = ring.lse + stage * kRowTile;
      const float* delta = ring.delta + stage * kRowTile;
      const int row0 = static_cast<int>(q0);
      // The exact mask's bit slot of this (query tile, key block): the 64
      // rows and the warpgroup's 64 keys each lie in one block. -1 where the
      // tile is full or the mask has no bits.
      int slot = -1;
      if constexpr (kTests != kTestsNone) {
        if (a.partial_index != nullptr) {
          const int64_t* st = a.partial_index_strides;
          slot = a.partial_index[kt.b * st[0] + h * st[1] + (q0 / a.block_q) * st[2] +
                                 ((kt.k0 + wg * 64) / a.block_k) * st[3]];
        }
      }
      if constexpr (kTests == kTestsNone) {
        const bool edge = a.causal && q0 < kt.k0 + NK - 1;
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = 8 * j + 2 * t4 + (e & 1);
            const bool hidden = edge && key_g + 8 * (e >> 1) > q0 + c;
            const float p = hidden ? 0.f : exp2_flush(s[4 * j + e] * scale_log2 - lse[c]);
            s[4 * j + e] = p;
            dp[4 * j + e] = p * (dp[4 * j + e] - delta[c]);
          }
        }
      } else if (slot < 0 && kTests != kTestsDocuments && row0 >= full_lo &&
                 row0 + kRowTile <= full_hi) {
#pragma unroll
        for (int i = 0; i < kRowTile / 2; ++i) {
          const int c = 8 * (i / 4) + 2 * t4 + (i & 1);
          const float p = exp2_flush(s[i] * scale_log2 - lse[c]);
          s[i] = p;
          dp[i] = p * (dp[i] - delta[c]);
        }
      } else {
        // Per element: the rows [lo, hi) that may see each of the lane's
        // two keys (none for a key past the batch's: cache junk), the
        // tile's bits and the document ids (rows past q_len and keys past
        // k_len read the last id). Hidden elements get P = dS = 0 by
        // selection, so junk K / V rows (NaN, say) give dK = dV = 0, as keys
        // that no row sees do in the generic kernel.
        int lo[2], hi[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          int64_t l, hh;
          visible_row_range(a, kt.b, key_g + 8 * r, l, hh);
          lo[r] = static_cast<int>(l);
          hi[r] = static_cast<int>(hh);
        }
        // Query row q0 + c's bits of the lane's keys: key_g and key_g + 8
        // share a 32-key word (key_g % 16 < 8), read shifted so that bit 0
        // is key_g's; all ones without a slot.
        const uint32_t* words = nullptr;
        int shift = 0;
        const int64_t* row_ids = nullptr;
        int64_t key_id[2] = {0, 0};
        if constexpr (kTests == kTestsDocuments) {
          row_ids = a.q_documents + kt.b * a.q_documents_stride;
          const int64_t* kv_ids = a.kv_documents + kt.b * a.kv_documents_stride;
#pragma unroll
          for (int r = 0; r < 2; ++r) key_id[r] = kv_ids[min(key_g + 8 * r, a.k_len - 1)];
        }
        if (slot >= 0) {
          const int key_col = static_cast<int>(key_g % a.block_k);
          words = a.partial_bits +
                  (slot * a.block_q + q0 % a.block_q) * a.bit_words + key_col / 32;
          shift = key_col % 32;
        }
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
#pragma unroll
          for (int col = 0; col < 2; ++col) {
            const int c = 8 * j + 2 * t4 + col;
            const uint32_t bits = words != nullptr ? words[c * a.bit_words] >> shift : ~0u;
            int64_t row_id = 0;
            if constexpr (kTests == kTestsDocuments) row_id = row_ids[min(q0 + c, a.q_len - 1)];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int e = 2 * r + col;
              const bool hidden = row0 + c < lo[r] || row0 + c >= hi[r] ||
                                  ((bits >> (8 * r)) & 1u) == 0 || row_id != key_id[r];
              const float p = hidden ? 0.f : exp2_flush(s[4 * j + e] * scale_log2 - lse[c]);
              s[4 * j + e] = p;
              dp[4 * j + e] = hidden ? 0.f : p * (dp[4 * j + e] - delta[c]);
            }
          }
        }
      }
#pragma unroll
      for (int kk = 0; kk < kRowTile / 16; ++kk) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          pt[kk][i] = pack2<T>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
          dst[kk][i] = pack2<T>(dp[8 * kk + 2 * i], dp[8 * kk + 2 * i + 1]);
        }
      }
      if constexpr (kFused) {
        // dS^T into this tile's buffer: word dst[kk][i] is key row
        // 16 wg_warp + g + 8 (i & 1) of the warpgroup, query columns
        // 8 (2 kk + i / 2) + 2 t4 and + 1, stored with the 128-byte swizzle
        // (16-byte chunk c of row r at c ^ (r % 8)). The buffer the tile
        // before last used is free: both warpgroups passed the barrier
        // below for the last tile after their MMAs on it were done.
        unsigned char* ds_tile = reinterpret_cast<unsigned char*>(dqb.ds + (partials % 2) * NK * kPanel);
#pragma unroll
        for (int kk = 0; kk < kRowTile / 16; ++kk) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int row = wg * 64 + wg_warp * 16 + g + 8 * (i & 1);
            const int chunk = (2 * kk + (i >> 1)) ^ g;  // row % 8 == g
            *reinterpret_cast<uint32_t*>(ds_tile + row * 128 + chunk * 16 + t4 * 4) = dst[kk][i];
          }
        }
        fence_proxy_async_shared();
        asm volatile("bar.sync 3, 256;\n" ::: "memory");
      }
      float dq[kFused ? 32 : 1];
      wgmma_fence();
      issue_values<T, D, kRowTile>(dv, pt, dos);
      issue_values<T, D, kRowTile>(dk, dst, qs);
      if constexpr (kFused) {
        // dQ[:, 64 wg + 0..63] = dS K over the NK keys: A is the dS^T tile,
        // B panel wg of the K tile, both stored key row by key row.
        const T* ds_tile = dqb.ds + (partials % 2) * NK * kPanel;
        const T* k_panel = ring.k + wg * NK * kPanel;
#pragma unroll
        for (int kk = 0; kk < NK / 16; ++kk) {
          wgmma_ss_mn<T, 64>(dq, swizzle128_descriptor(ds_tile + kk * 16 * kPanel, 0),
                             swizzle128_descriptor(k_panel + kk * 16 * kPanel, 0), kk > 0);
        }
        wgmma_commit();
      }
      wgmma_wait<0>();
      register_fence(dv);
      register_fence(dk);
      release(&ring.empty[stage]);
      if constexpr (kFused) {
        register_fence(dq);
        // The partial, in register order: float4 j of thread t of
        // warpgroup wg at (wg * 8 + j) * 128 + t, which write_dq_partials
        // and store_grad_q read back in the same order.
        const int buf = next_partial();
        float4* out = reinterpret_cast<float4*>(dqb.dq + buf * kRowTile * D) + wg * 8 * 128 +
                      threadIdx.x % 128;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          out[j * 128] = make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
        }
        fence_proxy_async_shared();
        if (warp == 0 && lane == 0) {
          dqb.where[buf] = DqWhere{static_cast<int>(q0), static_cast<int>(h),
                                   static_cast<int>(kt.b), static_cast<int>(kt.k0 / NK)};
        }
        __syncwarp();
        release(&dqb.full[buf]);
      }
      if (entry & kLastTile) break;
    }
    release(ring.kv_empty);
    // dK (times the scale) and dV of keys key_g and key_g + 8, those below k_len.
    const int64_t base = (kt.b * a.kv_heads + kt.g) * a.k_len;
    T* gk = static_cast<T*>(ba.grad_k);
    T* gv = static_cast<T*>(ba.grad_v);
    const float scale = static_cast<float>(a.scale);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t key = key_g + 8 * r;
      if (key >= a.k_len) continue;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const int64_t at = (base + key) * D + 8 * j + 2 * t4;
        *reinterpret_cast<uint32_t*>(gk + at) =
            pack2<T>(dk[4 * j + 2 * r] * scale, dk[4 * j + 2 * r + 1] * scale);
        *reinterpret_cast<uint32_t*>(gv + at) = pack2<T>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
      }
    }
  }
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

template <typename T, int D, int kConsumers, int STAGES, int kTests, bool kFused>
__global__ void __launch_bounds__(hopper_threads<kConsumers>(), kConsumers == 1 && D == 64 ? 2 : 1)
    hopper_grad_kv(const __grid_constant__ CUtensorMap q_map,
                   const __grid_constant__ CUtensorMap do_map,
                   const __grid_constant__ CUtensorMap k_map,
                   const __grid_constant__ CUtensorMap v_map,
                   const BlockSparseAttentionBackwardArgs ba, int64_t k_tiles, int* work_counter) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int NK = 64 * kConsumers;
  using L = std::conditional_t<kFused, FusedKeyTileLayout<D, NK, STAGES>,
                               KeyTileLayout<D, NK, STAGES>>;
  extern __shared__ unsigned char smem_raw[];
  const KeyTileRing<T> ring = carve_key_tile_ring<T, L>(smem_raw);
  DqBuffers<T> dqb{};
  if constexpr (kFused) dqb = carve_dq_buffers<T, L>(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    constexpr int kConsumerWarps = kConsumers * 4;  // each arrives once per release
    mbarrier_init(ring.kv_full, 1);
    mbarrier_init(ring.kv_empty, kConsumerWarps);
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(&ring.full[s], 1);
      mbarrier_init(&ring.empty[s], kConsumerWarps);
    }
    if constexpr (kFused) {
      for (int b = 0; b < 2; ++b) {
        mbarrier_init(&dqb.full[b], kConsumerWarps);
        mbarrier_init(&dqb.empty[b], 1);
      }
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // dK and dV stay in the consumers' registers for a whole item. The CTA's
  // register pool is what the launch allocated, 168 x 384 (the launch bound's
  // share of 64 K): 128 x 24 + 256 x 240 fills it exactly, as does the
  // fused kernel's 128 x 56 + 256 x 224 (its producer and dQ writer spill
  // least there). A split that asks for more leaves setmaxnreg.inc waiting for
  // ever.
  constexpr bool kMoveRegisters = kConsumers == 2;
  if (warp >= kConsumers * 4) {
    if constexpr (kMoveRegisters) warpgroup_registers_release<kFused ? 56 : 24>();
    if (warp == kConsumers * 4 && lane == 0) {
      produce_key_tiles<T, D, NK, L, kFused>(&q_map, &do_map, &k_map, &v_map, ba, k_tiles,
                                                  work_counter, ring);
    }
    if constexpr (kFused) {
      const int writer = warp - (kConsumers * 4 + 1);
      if (writer == 0 || writer == 1) write_dq_partials<T, D, NK>(ba, dqb, writer, lane);
    }
  } else {
    if constexpr (kMoveRegisters) warpgroup_registers_claim<kFused ? 224 : 240>();
    consume_key_tiles<T, D, kConsumers, STAGES, kTests, kFused>(ba, k_tiles, ring, dqb, warp,
                                                               lane);
  }
#endif
}

// ---------------------------------------------------------------- dQ

// One consumer warpgroup's 64 query rows of every work item: the walk over
// the item's key tiles, then the dQ store. Q and dO sit one after the other
// in the ring's Q buffer. kTests: the per-element mask tests
// (element_tests), one instantiation per level, so that the kernels without
// keep their registers.
template <typename T, int D, int kConsumers, int STAGES, int kTests>
__device__ inline void consume_query_tiles(const BlockSparseAttentionBackwardArgs& ba,
                                           int64_t q_tiles, const Ring<T>& ring, int warp,
                                           int lane) {
  constexpr int M = 64 * kConsumers;
  constexpr int N = kKeyTile;
  const BlockSparseAttentionArgs& a = ba.forward;
  const int wg = warp / 4, wg_warp = warp % 4;
  const int g = lane >> 2, t4 = lane & 3;
  const float scale_log2 = static_cast<float>(a.scale) * kLog2e;
  const T* q_rows = ring.q + wg * 64 * kPanel;
  const T* do_rows = ring.q + M * D + wg * 64 * kPanel;
  float s[N / 2], dp[N / 2];
  uint32_t ds[N / 16][4];
  int it = 0;
  auto release = [&](uint64_t* bar) {
    if (lane == 0) mbarrier_arrive(bar);
  };
  for (int n = 0;; ++n) {
    mbarrier_wait(ring.q_full, n & 1);
    const int item = *reinterpret_cast<volatile int*>(ring.q_item);
    if (item < 0) break;
    const QueryTile qt = query_tile(a, item, q_tiles, M);
    const int64_t wg_row0 = qt.q0 + wg * 64;
    const int64_t row_g = wg_row0 + wg_warp * 16 + g;  // rows row_g and row_g + 8
    // The rows' scratch; rows past q_len read the padding (lse +inf, delta 0).
    const int64_t scratch = (qt.b * a.heads + qt.h) * ba.rows_stride;
    const float* lse_rows = static_cast<const float*>(ba.lse_log2) + scratch;
    const float* delta_rows = static_cast<const float*>(ba.delta) + scratch;
    const float lse[2] = {lse_rows[row_g], lse_rows[row_g + 8]};
    const float delta[2] = {delta_rows[row_g], delta_rows[row_g + 8]};
    const LaneRowKeys row_keys(a, qt.b, row_g);
    float dq[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dq[i] = 0.f;
    for (;;) {
      const int stage = it % STAGES;
      const uint32_t parity = (it / STAGES) & 1;
      mbarrier_wait(&ring.k_full[stage], parity);
      ++it;
      const int entry = *reinterpret_cast<volatile int*>(&ring.tile_of[stage]);
      if (entry == kNoTile) {
        release(&ring.empty[stage]);
        release(ring.q_empty);
        break;
      }
      const int tile = entry & ~kLastTile;
      T* ks = ring.k + stage * N * D;
      T* vs = ring.v + stage * N * D;
      // V is waited for before the first MMA is issued: a wait (a spin loop)
      // between the issues of in-flight MMAs makes the compiler serialise
      // every wgmma of the kernel (ptxas C7520). With per-batch key counts,
      // K and V rows past this batch's keys hold the cache's junk: zeroed
      // here, before the MMAs read them (dS K and dO V^T would multiply a 0
      // by a NaN).
      mbarrier_wait(&ring.v_full[stage], parity);
      if (a.kv_lens != nullptr) {
        const int first_junk = static_cast<int>(keys_of(a, qt.b)) - tile * N;
        if (first_junk < N) {
          zero_rows_from<T, D, N>(ks, first_junk, wg);
          zero_rows_from<T, D, N>(vs, first_junk, wg);
        }
      }
      wgmma_fence();
      issue_scores<T, D, M, N>(s, q_rows, ks);
      issue_scores<T, D, M, N>(dp, do_rows, vs);
      wgmma_wait<0>();
      register_fence(s);
      register_fence(dp);
      // Q and dO are read by the two score MMAs only: after the item's last,
      // the producer may load the next item's.
      if (entry & kLastTile) release(ring.q_empty);
      scale_and_mask<N / 8>(s, scale_log2, tile * N, row_keys, t4);
      mask_elements<kTests, N / 8>(s, a, qt.b, qt.h, row_g, tile * N, t4);
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        const int r = (i >> 1) & 1;
        dp[i] = exp2_flush(s[i] - lse[r]) * (dp[i] - delta[r]);
      }
#pragma unroll
      for (int kk = 0; kk < N / 16; ++kk) {
#pragma unroll
        for (int i = 0; i < 4; ++i) ds[kk][i] = pack2<T>(dp[8 * kk + 2 * i], dp[8 * kk + 2 * i + 1]);
      }
      wgmma_fence();
      issue_values<T, D, N>(dq, ds, ks);
      wgmma_wait<0>();
      register_fence(dq);
      release(&ring.empty[stage]);
      if (entry & kLastTile) break;
    }
    // dQ times the scale, rows row_g and row_g + 8 below q_len.
    T* gq = static_cast<T*>(ba.grad_q) + (qt.b * a.heads + qt.h) * a.q_len * D;
    const float scale = static_cast<float>(a.scale);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = row_g + 8 * r;
      if (row >= a.q_len) continue;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        *reinterpret_cast<uint32_t*>(gq + row * D + 8 * j + 2 * t4) =
            pack2<T>(dq[4 * j + 2 * r] * scale, dq[4 * j + 2 * r + 1] * scale);
      }
    }
  }
}

template <typename T, int D, int kConsumers, int STAGES, int kTests>
__global__ void __launch_bounds__(hopper_threads<kConsumers>(), kConsumers == 1 ? 2 : 1)
    hopper_grad_q(const __grid_constant__ CUtensorMap q_map,
                  const __grid_constant__ CUtensorMap do_map,
                  const __grid_constant__ CUtensorMap k_map,
                  const __grid_constant__ CUtensorMap v_map,
                  const BlockSparseAttentionBackwardArgs ba, int64_t q_tiles, int* work_counter) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int M = 64 * kConsumers;
  using L = HopperLayout<D, M, kKeyTile, STAGES, 2>;
  extern __shared__ unsigned char smem_raw[];
  const Ring<T> ring = carve_ring<T, L>(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) init_ring(ring, STAGES, kConsumers * 4);
  __syncthreads();
  constexpr bool kMoveRegisters = kConsumers == 2;
  if (warp >= kConsumers * 4) {
    if constexpr (kMoveRegisters) warpgroup_registers_release<40>();
    if (warp == kConsumers * 4 && lane == 0) {
      const QueryOperands<2> query{{&q_map, &do_map}, {ba.forward.q_strides, ba.grad_out_strides}};
      produce<T, D, M, kKeyTile, STAGES>(query, &k_map, &v_map, ba.forward, q_tiles, work_counter,
                                         ring);
    }
  } else {
    if constexpr (kMoveRegisters) warpgroup_registers_claim<232>();
    consume_query_tiles<T, D, kConsumers, STAGES, kTests>(ba, q_tiles, ring, warp, lane);
  }
#endif
}

// ---------------------------------------------------------------- host side

// A persistent launch of `kernel` over `items` work items.
template <typename Kernel, typename... Args>
KernelStatus launch_persistent(Kernel kernel, int threads, int smem_bytes, int64_t items,
                               cudaStream_t stream, Args... args) {
  if (items == 0) return KernelStatus::ok();
  if (items > 0x7fffffff) return KernelStatus::invalid("too many tiles for one grid");
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return to_status(err);
  const int64_t ctas = std::min(items, resident_capacity(kernel, threads, smem_bytes));
  kernel<<<static_cast<unsigned>(ctas), threads, smem_bytes, stream>>>(args...);
  return launch_status();
}

// Three stages where they fit; the fused kernel's dQ buffers leave room
// for two.
template <int D, int NK, bool kFused>
constexpr int grad_kv_stages() {
  if constexpr (kFused) {
    return 2;
  } else {
    return KeyTileLayout<D, NK, 3>::kAllocBytes <= 227 * 1024 ? 3 : 2;
  }
}

template <typename T, int D, int kConsumers, bool kFused>
KernelStatus launch_grad_kv(const BlockSparseAttentionBackwardArgs& ba, int* work_counter,
                            cudaStream_t stream) {
  const BlockSparseAttentionArgs& a = ba.forward;
  constexpr int NK = 64 * kConsumers;
  constexpr int kStages = grad_kv_stages<D, NK, kFused>();
  using L = std::conditional_t<kFused, FusedKeyTileLayout<D, NK, kStages>,
                               KeyTileLayout<D, NK, kStages>>;
  static_assert(L::kAllocBytes <= 227 * 1024, "the layout must fit one SM's shared memory");
  CUtensorMap q_map, do_map, k_map, v_map;
  if (!encode_operand(&q_map, a.dtype, a.q, a.batch, a.heads, a.q_len, D, a.q_strides, kRowTile) ||
      !encode_operand(&do_map, a.dtype, ba.grad_out, a.batch, a.heads, a.q_len, D,
                      ba.grad_out_strides, kRowTile) ||
      !encode_operand(&k_map, a.dtype, a.k, a.batch, a.kv_heads, a.k_len, D, a.k_strides, NK) ||
      !encode_operand(&v_map, a.dtype, a.v, a.batch, a.kv_heads, a.k_len, D, a.v_strides, NK)) {
    return KernelStatus::invalid("could not describe the operands to the tensor copy engine");
  }
  const int64_t k_tiles = ceil_div(a.k_len, NK);
  // Position conditions take the per-element tests of the bits' level.
  const int level =
      std::max(element_tests(a), has_position_conditions(a) ? kTestsBits : kTestsNone);
  const auto kernel = dispatch_element_tests(level, [](auto tests) {
    return hopper_grad_kv<T, D, kConsumers, kStages, decltype(tests)::value, kFused>;
  });
  return launch_persistent(kernel, hopper_threads<kConsumers>(), L::kAllocBytes,
                           k_tiles * a.batch * a.kv_heads, stream, q_map, do_map, k_map, v_map,
                           ba, k_tiles, work_counter);
}

// ---------------------------------------------------------------- fused dQ

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
// of half w (128 threads, warp t / 32, lane l) holds rows 16 (t / 32) + l / 4
// and + 8, columns 64 w + 8 j + 2 (l % 4) and + 1.
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

// dK, dV and dQ in one pass: zero the accumulator, start each query tile's
// order, run the fused kernel, then cast the accumulator to grad_q.
template <typename T, int D>
KernelStatus launch_fused(const BlockSparseAttentionBackwardArgs& ba, int* work_counter,
                          cudaStream_t stream) {
  const BlockSparseAttentionArgs& a = ba.forward;
  constexpr int NK = 128;
  const int64_t tiles = a.batch * a.heads * (ba.rows_stride / kRowTile);
  cudaError_t err = cudaMemsetAsync(ba.dq_accum, 0, tiles * kRowTile * D * 4, stream);
  if (err != cudaSuccess) return to_status(err);
  if (tiles > 0) {
    start_dq_order<NK><<<static_cast<unsigned>(ceil_div(tiles, int64_t{256})), 256, 0, stream>>>(ba);
    const KernelStatus started = launch_status();
    if (!started.is_ok()) return started;
  }
  const KernelStatus kv = launch_grad_kv<T, D, 2, true>(ba, work_counter, stream);
  if (!kv.is_ok()) return kv;
  const int64_t q_blocks = a.batch * a.heads * ceil_div(a.q_len, int64_t{kRowTile});
  if (q_blocks == 0) return KernelStatus::ok();
  if (q_blocks > 0x7fffffff) return KernelStatus::invalid("too many tiles for one grid");
  store_grad_q<T, D><<<static_cast<unsigned>(q_blocks), 256, 0, stream>>>(ba);
  return launch_status();
}

template <typename T, int D, int kConsumers>
KernelStatus launch_grad_q(const BlockSparseAttentionBackwardArgs& ba, int* work_counter,
                           cudaStream_t stream) {
  const BlockSparseAttentionArgs& a = ba.forward;
  constexpr int M = 64 * kConsumers;
  constexpr int kStages =
      kConsumers > 1 && HopperLayout<D, M, kKeyTile, 3, 2>::kAllocBytes <= 227 * 1024 ? 3 : 2;
  using L = HopperLayout<D, M, kKeyTile, kStages, 2>;
  CUtensorMap q_map, do_map, k_map, v_map;
  if (!encode_operand(&q_map, a.dtype, a.q, a.batch, a.heads, a.q_len, D, a.q_strides, M) ||
      !encode_operand(&do_map, a.dtype, ba.grad_out, a.batch, a.heads, a.q_len, D,
                      ba.grad_out_strides, M) ||
      !encode_operand(&k_map, a.dtype, a.k, a.batch, a.kv_heads, a.k_len, D, a.k_strides,
                      kKeyTile) ||
      !encode_operand(&v_map, a.dtype, a.v, a.batch, a.kv_heads, a.k_len, D, a.v_strides,
                      kKeyTile)) {
    return KernelStatus::invalid("could not describe the operands to the tensor copy engine");
  }
  const int64_t q_tiles = ceil_div(a.q_len, M);
  const auto kernel = dispatch_element_tests(element_tests(a), [](auto tests) {
    return hopper_grad_q<T, D, kConsumers, kStages, decltype(tests)::value>;
  });
  return launch_persistent(kernel, hopper_threads<kConsumers>(), L::kAllocBytes,
                           q_tiles * a.batch * a.heads, stream, q_map, do_map, k_map, v_map, ba,
                           q_tiles, work_counter);
}

template <typename T, int D>
KernelStatus launch_for_blocks(const BlockSparseAttentionBackwardArgs& ba, int* counters,
                               cudaStream_t s) {
  const BlockSparseAttentionArgs& a = ba.forward;
  if (ba.dq_accum != nullptr) {
    if constexpr (D == 128) return launch_fused<T, D>(ba, counters, s);
  }
  // 64 keys (one warpgroup) per dK / dV item: the kernel also takes 128-key
  // items (two warpgroups, for key blocks of 128), which are not selected
  // until measured. 128 query rows per dQ item where the query block allows it.
  const KernelStatus kv = launch_grad_kv<T, D, 1, false>(ba, counters, s);
  if (!kv.is_ok()) return kv;
  return a.block_q % 128 == 0 ? launch_grad_q<T, D, 2>(ba, counters + 1, s)
                              : launch_grad_q<T, D, 1>(ba, counters + 1, s);
}

template <typename T>
KernelStatus launch_for_dtype(const BlockSparseAttentionBackwardArgs& ba, int* counters,
                              cudaStream_t s) {
  return ba.forward.head_dim == 64 ? launch_for_blocks<T, 64>(ba, counters, s)
                                   : launch_for_blocks<T, 128>(ba, counters, s);
}

}  // namespace

KernelStatus block_sparse_attention_backward_hopper_cuda(const BlockSparseAttentionBackwardArgs& ba,
                                                         int* work_counters, void* stream) {
  BlockSparseAttentionArgs layout = ba.forward;  // the alignment test of the forward's operands
  layout.out = const_cast<void*>(ba.grad_out);  // only its address is tested
  std::copy(ba.grad_out_strides, ba.grad_out_strides + 4, layout.out_strides);
  if (tensor_core_tile_rows(layout) == 0 || ba.forward.head_dim > 128 ||
      ba.rows_stride % 128 != 0) {
    return KernelStatus::invalid("problem not eligible for the Hopper backward kernels");
  }
  if (ba.dq_accum != nullptr &&
      (ba.forward.head_dim != 128 || ba.forward.block_k % 128 != 0 || ba.dq_order == nullptr)) {
    return KernelStatus::invalid("problem not eligible for the fused Hopper backward kernel");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  if (ba.forward.dtype == FloatDtype::kFloat16) return launch_for_dtype<__half>(ba, work_counters, s);
  return launch_for_dtype<__nv_bfloat16>(ba, work_counters, s);
}

bool block_sparse_attention_backward_hopper_fuses(const BlockSparseAttentionBackwardArgs& ba) {
  return ba.forward.head_dim == 128 && ba.forward.block_k % 128 == 0;
}

}  // namespace baracuda
