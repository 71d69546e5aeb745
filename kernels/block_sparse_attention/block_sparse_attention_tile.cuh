// Pieces both tensor-core executors share: which query tile a CTA owns, the
// walk over the key tiles it must visit, the online softmax of a thread's two
// rows and the epilogue that stores them. Per warp, accumulators follow the
// mma.sync / wgmma fragment layout: lane = 4 g + t4 holds rows g and g + 8
// of the warp's 16, columns 8 j + 2 t4 + {0, 1} of every 8-column group j,
// as x[4 j + 0..1] (row g) and x[4 j + 2..3] (row g + 8).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "common/fast_exp2.h"

namespace baracuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Two floats as one register of two 16-bit values, `lo` in the low half
// (the lower column index of a fragment pair).
template <typename T>
__device__ inline uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same<T, __half>::value) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The M query rows [q0, q0 + M) of one (batch, head) a CTA owns, and the
// keys [key_begin, key_end) of its split (all keys without splits).
struct QueryTile {
  int64_t b, h, kv_head, q0, q_last;
  int64_t split, key_begin, key_end;
};

// Work order: (batch, head) outermost, so the tiles that run at the same
// time belong to a few heads and read the same keys and values, which then
// come from L2 rather than from memory (tile-rank outermost spread them over
// every head, and a random mask then read most K/V tiles from memory once per
// query tile). With causal attention a head's last tiles (the most keys) go
// first. The splits of a query tile are consecutive items.
__device__ inline QueryTile query_tile(const BlockSparseAttentionArgs& a, int64_t item,
                                       int64_t q_tiles, int M) {
  // Items number below 2^31 (the launchers check): 32-bit division, which
  // also keeps the consumers' register budget where it was without splits.
  int64_t split = 0, cta = item;
  if (a.kv_splits > 1) {
    const int i = static_cast<int>(item), n = static_cast<int>(a.kv_splits);
    split = i % n;
    cta = i / n;
  }
  const int64_t bh = cta / q_tiles, rank = cta % q_tiles;
  const int64_t qt = a.causal ? q_tiles - 1 - rank : rank;
  QueryTile t;
  t.h = bh % a.heads;
  t.b = bh / a.heads;
  t.kv_head = t.h / (a.heads / a.kv_heads);
  t.q0 = qt * M;
  t.q_last = min(t.q0 + M, a.q_len) - 1;
  t.split = split;
  t.key_begin = a.kv_splits > 1 ? split * a.split_keys : 0;
  t.key_end = a.kv_splits > 1 ? min(t.key_begin + a.split_keys, a.k_len) : a.k_len;
  return t;
}

// The key tiles (`tile_keys` keys each, a divisor of block_k) a query tile
// visits: those of mask blocks that are on, inside the keys its rows may see
// by position (and its split's). Every thread reads the same mask bytes, so
// the walk is uniform. Tile indices are 32-bit (the kernels address keys
// with 32-bit coordinates), which keeps the block arithmetic cheap.
//
// A sparse mask makes the walker (the forward's producer thread) skip many
// off blocks for each block it finds, and a dependent load per block paid a
// memory latency each. So the walk reads the mask row a window at a time,
// as a bitmap of up to 32 blocks: two 16-byte loads where the row is
// contiguous, eight independent byte loads where it is not, and then finds
// on blocks with bit scans.
struct KeyTileWalk {
  const BlockSparseAttentionArgs& a;
  const uint8_t* mask_row;
  int first_tile, n_tiles, tiles_per_block, blocks_end;
  int window_first = 0, window_end = 0;  // blocks the bitmap covers
  uint32_t window_bits = 0;              // bit i: block window_first + i is on

  __device__ KeyTileWalk(const BlockSparseAttentionArgs& args, const QueryTile& t, int tile_keys)
      : a(args),
        mask_row(baracuda::mask_row(args, t.b, t.h, t.q0 / args.block_q)),
        tiles_per_block(static_cast<int>(args.block_k / tile_keys)) {
    int64_t lo = 0, hi = args.causal ? min(t.q_last + 1, args.k_len) : args.k_len;
    if (has_position_conditions(args) || args.q_period > 0 || args.kv_splits > 1) {
      rows_key_range(args, t.b, t.q0, t.q_last, lo, hi);
      lo = max(lo, t.key_begin);
      hi = min(hi, t.key_end);
    }
    // 32-bit from here: keys are (0 <= lo, hi <= k_len < 2^31).
    const int first = static_cast<int>(lo), end = static_cast<int>(hi);
    first_tile = first / tile_keys;
    n_tiles = end > first ? (end + tile_keys - 1) / tile_keys : first_tile;
    blocks_end = (n_tiles + tiles_per_block - 1) / tiles_per_block;
  }

  // First tile at or after `t` whose mask block is on (n_tiles if none).
  // Calls must ask for non-decreasing `t`.
  __device__ int next(int t) {
    if (t < first_tile) t = first_tile;
    if (t >= n_tiles) return n_tiles;
    const int kb = t / tiles_per_block;
    for (int b = kb; b < blocks_end; b = window_end) {
      if (b < window_first || b >= window_end) load_window(b);
      const uint32_t bits = window_bits >> (b - window_first);
      if (bits != 0) {
        const int on = b + __ffs(bits) - 1;
        return on == kb ? t : on * tiles_per_block;
      }
    }
    return n_tiles;
  }

  // The bitmap of blocks [b, window_end): from b (and perhaps a few blocks
  // before it, whose bits are cleared) to at most blocks_end.
  __device__ void load_window(int b) {
    if (a.mask_strides[3] == 1) {
      // Two aligned 16-byte chunks from the one holding block b; a chunk
      // holding one of the row's bytes lies inside the mask's allocation.
      const uintptr_t at = reinterpret_cast<uintptr_t>(mask_row + b);
      const uintptr_t base = at & ~uintptr_t{15};
      window_first = b - static_cast<int>(at - base);
      window_end = min(window_first + 32, blocks_end);
      const uint4 lo = *reinterpret_cast<const uint4*>(base);
      uint4 hi = make_uint4(0, 0, 0, 0);
      if (window_first + 16 < window_end) hi = *reinterpret_cast<const uint4*>(base + 16);
      const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      uint32_t bits = 0;
#pragma unroll
      for (int w = 0; w < 8; ++w) bits |= nonzero_bytes(words[w]) << (4 * w);
      window_bits = bits & (~0u << (b - window_first)) & low_bits(window_end - window_first);
    } else {
      window_first = b;
      window_end = min(b + 8, blocks_end);
      uint32_t bits = 0;
#pragma unroll
      for (int p = 0; p < 8; ++p) {
        const bool on = b + p < window_end && key_block_on(a, mask_row, b + p);
        bits |= static_cast<uint32_t>(on) << p;
      }
      window_bits = bits;
    }
  }

  // Bit i set where byte i of `word` is nonzero.
  __device__ static uint32_t nonzero_bytes(uint32_t word) {
    const uint32_t ones = __vcmpne4(word, 0u) & 0x01010101u;
    return (ones * 0x01020408u) >> 24;
  }
  __device__ static uint32_t low_bits(int n) { return n >= 32 ? ~0u : (1u << n) - 1u; }
};

// The keys [lo, hi) that a lane's rows row_g (r = 0) and row_g + 8 (r = 1)
// may see by position, for mask_scores; 32-bit, as the kernels' key
// coordinates are (0 <= lo <= hi <= k_len).
struct LaneRowKeys {
  int lo[2], hi[2];

  __device__ LaneRowKeys(const BlockSparseAttentionArgs& a, int64_t b, int64_t row_g) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int64_t l, h;
      visible_key_range(a, b, row_g + 8 * r, l, h);
      lo[r] = static_cast<int>(l);
      hi[r] = static_cast<int>(h);
    }
  }
};

// Hides the scores of one key tile (SJ 8-key groups from key0) whose keys
// lie outside a row's position range (past its batch's keys, after it with
// causal attention, outside its window): -inf. Only a tile that reaches
// outside the lane's ranges needs the test. Returns the factor that brings
// the scores to log2 units, which the softmax applies inside its exponent
// (one FFMA per score, where scaling first and subtracting the max cost two
// instructions): the row max commutes with a positive scale, bit for bit, as
// rounding is monotonic. A scale that is not positive (zero, negative, NaN)
// is applied here instead, and the factor is 1.
template <int SJ>
__device__ inline float mask_scores(float (&s)[4 * SJ], float scale_log2, int key0,
                                    const LaneRowKeys& rows, int t4) {
  const bool raw = scale_log2 > 0.f;
  const bool edge = max(rows.lo[0], rows.lo[1]) > key0 ||
                    min(rows.hi[0], rows.hi[1]) < key0 + 8 * SJ;
  if (!edge) {  // the common case, kept free of the per-element tests
    if (!raw) {
#pragma unroll
      for (int i = 0; i < 4 * SJ; ++i) s[i] *= scale_log2;
    }
    return raw ? scale_log2 : 1.f;
  }
  const float pre = raw ? 1.f : scale_log2;
  // Key key0 + c sits in column c; this lane's columns are 8 j + 2 t4 + {0, 1}.
#pragma unroll
  for (int j = 0; j < SJ; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + j * 8 + 2 * t4 + (e & 1);
      const int r = e >> 1;
      const bool hidden = key < rows.lo[r] || key >= rows.hi[r];
      s[4 * j + e] = hidden ? -INFINITY : s[4 * j + e] * pre;
    }
  }
  return raw ? scale_log2 : 1.f;
}

// Hides the scores of an exact mask's partial tile whose bits are clear:
// one key tile (SJ 8-key groups from key0, a multiple of 64, inside one mask
// block) of the lane's rows row_g and row_g + 8 (inside one query block) of
// head h in batch b. A tile that is full (or the mask without bits) is left
// as it is.
template <int SJ>
__device__ inline void mask_partial_bits(float (&s)[4 * SJ], const BlockSparseAttentionArgs& a,
                                         int64_t b, int64_t h, int64_t row_g, int key0, int t4) {
  const int64_t qb = row_g / a.block_q;
  const int kb = key0 / static_cast<int>(a.block_k);
  const int64_t* st = a.partial_index_strides;
  const int32_t slot = a.partial_index[b * st[0] + h * st[1] + qb * st[2] + kb * st[3]];
  if (slot < 0) return;
  // Column c of the tile is key c0 + c of the block; a lane's columns
  // 8 j + 2 t4 + {0, 1} all lie in word j / 4 of the tile's (c0 is a
  // multiple of 32).
  const int c0 = key0 - kb * static_cast<int>(a.block_k);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t* words =
        a.partial_bits + (slot * a.block_q + (row_g + 8 * r - qb * a.block_q)) * a.bit_words +
        c0 / 32;
#pragma unroll
    for (int i = 0; i < SJ / 4; ++i) {
      const uint32_t word = words[i];
#pragma unroll
      for (int j = 4 * i; j < 4 * i + 4; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int bit = (8 * j + 2 * t4 + e) % 32;
          if (((word >> bit) & 1u) == 0) s[4 * j + 2 * r + e] = -INFINITY;
        }
      }
    }
  }
}

// Hides the scores of keys whose document id differs from the row's
// (document_ids): one key tile (SJ 8-key groups from key0) of the lane's
// rows row_g and row_g + 8 in batch b. Rows past q_len and keys past k_len
// read the last id: their scores are hidden by position or never stored.
template <int SJ>
__device__ inline void mask_other_documents(float (&s)[4 * SJ], const BlockSparseAttentionArgs& a,
                                            int64_t b, int64_t row_g, int key0, int t4) {
  const int64_t* q_ids = a.q_documents + b * a.q_documents_stride;
  const int64_t* kv_ids = a.kv_documents + b * a.kv_documents_stride;
  int64_t row_id[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) row_id[r] = q_ids[min(row_g + 8 * r, a.q_len - 1)];
  const int last_key = static_cast<int>(a.k_len) - 1;
#pragma unroll
  for (int j = 0; j < SJ; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t id = kv_ids[min(key0 + 8 * j + 2 * t4 + e, last_key)];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (id != row_id[r]) s[4 * j + 2 * r + e] = -INFINITY;
      }
    }
  }
}

// The per-element tests of level kTests (kTestsBits: the exact mask's bits,
// which the problem has; kTestsDocuments: document ids, and bits where
// there are), as mask_partial_bits and mask_other_documents do them.
template <int kTests, int SJ>
__device__ inline void mask_elements(float (&s)[4 * SJ], const BlockSparseAttentionArgs& a,
                                     int64_t b, int64_t h, int64_t row_g, int key0, int t4) {
  if constexpr (kTests == kTestsBits) {
    mask_partial_bits<SJ>(s, a, b, h, row_g, key0, t4);
  } else if constexpr (kTests == kTestsDocuments) {
    if (a.partial_index != nullptr) mask_partial_bits<SJ>(s, a, b, h, row_g, key0, t4);
    mask_other_documents<SJ>(s, a, b, row_g, key0, t4);
  }
}

// Running max (log2 units) and this lane's partial sum of its rows g and
// g + 8; the four lanes of a row add their sums up at the end.
struct OnlineSoftmaxRows {
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  // s: scores of SJ 8-key groups, in log2 units once multiplied by
  // `factor` (positive; see mask_scores), replaced by P = 2^(factor s - max)
  // under the new running max. corr: the factor by which what was summed
  // under the old max (the sums here, the output accumulator via rescale)
  // must be multiplied.
  template <int SJ>
  __device__ void update(float (&s)[4 * SJ], float factor, float (&corr)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < SJ; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_max[r], mx * factor);
      // A row with no visible key so far keeps max -inf; subtract 0 instead
      // so that 2^(-inf - (-inf)) never makes a NaN.
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      corr[r] = exp2_flush(row_max[r] - m_use);
      row_max[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < SJ; ++j) {
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          const float p = exp2_flush(fmaf(s[4 * j + e], factor, -m_use));
          s[4 * j + e] = p;
          sum += p;
        }
      }
      row_sum[r] = row_sum[r] * corr[r] + sum;
    }
  }

  // o: an accumulator of OJ 8-column groups, brought to the new max.
  template <int OJ>
  __device__ static void rescale(float (&o)[4 * OJ], const float (&corr)[2]) {
#pragma unroll
    for (int j = 0; j < OJ; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * j + e] *= corr[e >> 1];
    }
  }

  // Normalises and stores rows row_g and row_g + 8 (those below q_len) of
  // out and lse; an empty row is (0, -inf). With split keys, the split's
  // partial state, out in float32.
  template <typename T, int OJ>
  __device__ void store(const BlockSparseAttentionArgs& a, const QueryTile& t,
                        const float (&o)[4 * OJ], int64_t row_g, int t4) const {
    if (a.kv_splits > 1) {
      store_rows<float, OJ>(a, t, o, row_g, t4, t.split * a.out_split_stride,
                            t.split * a.lse_split_stride);
    } else {
      store_rows<T, OJ>(a, t, o, row_g, t4, 0, 0);
    }
  }

  template <typename O, int OJ>
  __device__ void store_rows(const BlockSparseAttentionArgs& a, const QueryTile& t,
                             const float (&o)[4 * OJ], int64_t row_g, int t4, int64_t out_offset,
                             int64_t lse_offset) const {
    O* og = static_cast<O*>(a.out) + out_offset + t.b * a.out_strides[0] + t.h * a.out_strides[1];
    float* lg = static_cast<float*>(a.lse) + lse_offset + t.b * a.lse_strides[0] +
                t.h * a.lse_strides[1];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int64_t row = row_g + r * 8;
      if (row >= a.q_len) continue;
      // Only a row that saw no key has l == 0 with max -inf (the empty
      // state, (0, -inf)); a NaN score leaves l NaN, and a scaled score past
      // the float range a max of +inf with l == 0: both reach out and lse
      // as NaN.
      const bool empty = l == 0.f && row_max[r] == -INFINITY;
      const float inv = empty ? 0.f : 1.f / l;
      O* orow = og + row * a.out_strides[2];
#pragma unroll
      for (int j = 0; j < OJ; ++j) {
        const float lo = o[4 * j + 2 * r] * inv, hi = o[4 * j + 2 * r + 1] * inv;
        if constexpr (std::is_same<O, float>::value) {
          *reinterpret_cast<float2*>(orow + j * 8 + t4 * 2) = make_float2(lo, hi);
        } else {
          *reinterpret_cast<uint32_t*>(orow + j * 8 + t4 * 2) = pack2<O>(lo, hi);
        }
      }
      if (t4 == 0) {
        lg[row * a.lse_strides[2]] = empty ? -INFINITY : (row_max[r] + log2f(l)) * kLn2;
      }
    }
  }
};

}  // namespace baracuda
