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
#include "block_sparse_attention/block_sparse_attention_hopper_dq_order.cuh"
#include "block_sparse_attention/block_sparse_attention_hopper_key_tiles.cuh"
#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "block_sparse_attention/block_sparse_attention_tile.cuh"
#include "common/cuda_launch.cuh"
#include "common/fast_exp2.h"
#include "common/hopper.cuh"
#include "common/tensor_map.h"
#include "common/wgmma_ops.cuh"

namespace baracuda {
namespace {

constexpr int kKeyTile = 64;  // keys per streamed tile of the dQ kernel

// ---------------------------------------------------------------- dK / dV

// One consumer warpgroup's 64 keys of every work item: the walk over the
// item's query tiles, then the dK / dV store. kTests: from kTestsBits up,
// position conditions (kv_lens, windows, bottom-right causal) and
// exact-mask bits are tested per element, at kTestsDocuments document ids
// too; at kTestsNone only top-left causal is, in fewer registers (the
// general test spills in the D = 64 kernel, which two CTAs share an SM).
//
// kFused (two consumers, D = 128): per query tile the warpgroups also put
// dS^T into shared memory and compute dQ = dS K (K from the item's tile),
// each 64 of the D columns over all NK keys, which goes to a dQ writer as
// one float32 partial.
template <typename T, int D, int kConsumers, int STAGES, int kTests, bool kFused>
__device__ inline void consume_key_tiles(const BlockSparseAttentionBackwardArgs& ba,
                                         int64_t k_tiles, const KeyTileRing<T>& ring,
                                         const DqBuffers<T>& dqb, int warp, int lane) {
  constexpr int NK = 64 * kConsumers;
  constexpr int kCols = kRowTile / 8;  // 8-column groups of S^T
  static_assert(!kFused || (kConsumers == 2 && D == 128),
                "the fused kernel runs two consumer warpgroups over 128 columns");
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
      // warpgroups' barrier before its first MMA.
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
        // before last used is free: the warpgroups that read it passed the
        // barrier below for the last tile after their MMAs on it were done.
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
        // Each warpgroup's dQ reads both halves of dS^T.
        asm volatile("bar.sync 3, 256;\n" ::: "memory");
      }
      float dq[kFused ? 32 : 1];
      wgmma_fence();
      issue_values<T, D, kRowTile>(dv, pt, dos);
      issue_values<T, D, kRowTile>(dk, dst, qs);
      if constexpr (kFused) {
        // dQ[:, 64 wg + 0..63] = dS K over the NK keys, A the dS^T tile and
        // B panel wg of the K tile, both stored key row by key row.
        const T* ds_rows = dqb.ds + (partials % 2) * NK * kPanel;
        const T* k_cols = ring.k + wg * NK * kPanel;
#pragma unroll
        for (int kk = 0; kk < NK / 16; ++kk) {
          wgmma_ss_mn<T, 64>(dq, swizzle128_descriptor(ds_rows + kk * 16 * kPanel, 0),
                             swizzle128_descriptor(k_cols + kk * 16 * kPanel, 0), kk > 0);
        }
        wgmma_commit();
      }
      wgmma_wait<0>();
      register_fence(dv);
      register_fence(dk);
      release(&ring.empty[stage]);
      if constexpr (kFused) {
        register_fence(dq);
        // The partial, in register order: float4 j of thread t of column
        // half (warpgroup) c at (c * 8 + j) * 128 + t, which
        // write_dq_partials and store_grad_q read back in the same order.
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
  // share of 64 K): 128 x 24 + 256 x 240 fills it exactly. The fused
  // kernel needs all 240 too: at 224 its dQ accumulators do not fit beside
  // dK and dV, and ptxas serialises every wgmma (C7512); its producer and dQ
  // writers spill a little at 24 instead. A split that asks for more leaves
  // setmaxnreg.inc waiting for ever.
  constexpr bool kMoveRegisters = kConsumers == 2;
  if (warp >= kConsumers * 4) {
    if constexpr (kMoveRegisters) warpgroup_registers_release<24>();
    if (warp == kConsumers * 4 && lane == 0) {
      produce_key_tiles<T, D, NK, L, kFused>(&q_map, &do_map, &k_map, &v_map, ba, k_tiles,
                                                  work_counter, ring);
    }
    if constexpr (kFused) {
      const int writer = warp - (kConsumers * 4 + 1);
      if (writer == 0 || writer == 1) write_dq_partials<T, D, NK>(ba, dqb, writer, lane);
    }
  } else {
    if constexpr (kMoveRegisters) warpgroup_registers_claim<240>();
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
      const float factor = mask_scores<N / 8>(s, scale_log2, tile * N, row_keys, t4);
      mask_elements<kTests, N / 8>(s, a, qt.b, qt.h, row_g, tile * N, t4);
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        const int r = (i >> 1) & 1;
        dp[i] = exp2_flush(fmaf(s[i], factor, -lse[r])) * (dp[i] - delta[r]);
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
    return FusedKeyTileLayout<D, NK, 3>::kAllocBytes <= 227 * 1024 ? 3 : 2;
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
  store_grad_q<T, D><<<static_cast<unsigned>(q_blocks), D / 64 * 128, 0, stream>>>(ba);
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
  if constexpr (D == 128) {
    if (ba.dq_accum != nullptr) return launch_fused<T, D>(ba, counters, s);
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
      (!block_sparse_attention_backward_hopper_fuses(ba) || ba.dq_order == nullptr)) {
    return KernelStatus::invalid("problem not eligible for the fused Hopper backward kernel");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  if (ba.forward.dtype == FloatDtype::kFloat16) return launch_for_dtype<__half>(ba, work_counters, s);
  return launch_for_dtype<__nv_bfloat16>(ba, work_counters, s);
}

// D = 64 runs the two kernels: a fused form there did not beat them by
// enough to earn a second path (docs/design/block_sparse_attention.md).
bool block_sparse_attention_backward_hopper_fuses(const BlockSparseAttentionBackwardArgs& ba) {
  return ba.forward.head_dim == 128 && ba.forward.block_k % 128 == 0;
}

}  // namespace baracuda
