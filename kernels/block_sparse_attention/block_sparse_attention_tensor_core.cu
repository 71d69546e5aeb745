// Tensor-core executor of block-sparse attention (float16 / bfloat16,
// head_dim == v_dim in {64, 128}, block_q and block_k multiples of 64),
// FlashAttention-2 style on mma.sync.m16n8k16 with float32 accumulation.
//
// One CTA owns M query rows (M = 64: 4 warps, M = 128: 8 warps; M divides
// block_q, so the tile lies in one query block) of one (batch, head); each
// warp owns 16 rows and keeps their Q fragments, running max / sum and output
// accumulator in registers. The CTA walks only the key tiles (64 keys) whose
// mask block is on -- and only those its rows may see by position --
// loading each K/V tile into shared memory with cp.async, double-buffered
// so the next tile streams in while the current one is multiplied.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with 16-bit inputs), lane = 4 g + t:
//   A 16x16 row-major: a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B 16x8 "col":      b0 (k 2t..2t+1, n g)  b1 (k 2t+8..2t+9, n g)
//   C/D 16x8 float:    c0 c1 (g, 2t..2t+1)  c2 c3 (g+8, 2t..2t+1)
// S = Q K^T takes B from K rows (key = n, d = k contiguous: plain ldmatrix);
// O = P V takes A from S's accumulator (same rows, columns paired) and B from
// V rows through ldmatrix.trans.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "block_sparse_attention/block_sparse_attention_tile.cuh"
#include "common/cp_async.cuh"
#include "common/cuda_launch.cuh"

namespace baracuda {
namespace {

constexpr int kKeyTile = 64;  // keys per pipeline stage

// ---------------------------------------------------------------- PTX wrappers

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// c[0..3] += a * b on one m16n8k16 tile.
template <typename T>
__device__ inline void mma(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---------------------------------------------------------------- shared tiles
//
// A tile is rows x D 16-bit elements, row-major, in 16-byte chunks; chunk c of
// row r sits at chunk position c ^ (r % 8). ldmatrix reads one chunk column
// of 8 consecutive rows at once, and the XOR spreads those 8 chunks over all
// 32 banks instead of one 4-bank group.
template <int D>
__device__ inline int swizzled(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Rows [row0, row0 + ROWS) of a global matrix with unit inner stride into a
// shared tile; rows at or beyond `len` are zero-filled (a zero key scores
// finite and is masked to -inf, a zero value row keeps 0 * p finite).
template <int ROWS, int D, int THREADS, typename T>
__device__ inline void load_tile(T* tile, const T* src, int64_t row_stride, int64_t row0,
                                 int64_t len) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += THREADS) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = row0 + r < len;
    // An invalid row still gets a mapped address (row 0); nothing is read from it.
    const T* from = src + (valid ? row0 + r : 0) * row_stride + c * 8;
    cp_async16(tile + swizzled<D>(r, c), from, valid);
  }
}

// ---------------------------------------------------------------- the kernel

template <typename T, int D, int M>
__global__ void __launch_bounds__(M / 16 * 32)
    tensor_core_attention(const BlockSparseAttentionArgs a, int64_t q_tiles) {
  constexpr int kWarps = M / 16, kThreads = kWarps * 32;
  constexpr int kKSteps = D / 16;           // k-steps of S = Q K^T
  constexpr int kSTiles = kKeyTile / 8;     // n-tiles of S (key columns)
  constexpr int kOTiles = D / 8;            // n-tiles of O (value columns)
  extern __shared__ __align__(16) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);       // M x D
  T* sk = sq + M * D;                       // 2 stages x kKeyTile x D
  T* sv = sk + 2 * kKeyTile * D;            // 2 stages x kKeyTile x D

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t4 = lane & 3;

  const QueryTile qtile = query_tile(a, blockIdx.x, q_tiles, M);
  KeyTileWalk walk(a, qtile, kKeyTile);
  const int64_t b = qtile.b, h = qtile.h, kvh = qtile.kv_head, q0 = qtile.q0;
  const int n_tiles = walk.n_tiles;

  const T* qg = static_cast<const T*>(a.q) + b * a.q_strides[0] + h * a.q_strides[1];
  const T* kg = static_cast<const T*>(a.k) + b * a.k_strides[0] + kvh * a.k_strides[1];
  const T* vg = static_cast<const T*>(a.v) + b * a.v_strides[0] + kvh * a.v_strides[1];

  // Keys past the batch's count are zero-filled like those past k_len: the
  // cache may hold anything there (NaN, say), and 0 * NaN is NaN.
  const int64_t keys = keys_of(a, b);
  int tile = walk.next(0);
  load_tile<M, D, kThreads>(sq, qg, a.q_strides[2], q0, a.q_len);
  if (tile < n_tiles) {
    const int64_t key0 = int64_t{tile} * kKeyTile;
    load_tile<kKeyTile, D, kThreads>(sk, kg, a.k_strides[2], key0, keys);
    load_tile<kKeyTile, D, kThreads>(sv, vg, a.v_strides[2], key0, keys);
  }
  cp_async_commit();

  const float scale_log2 = static_cast<float>(a.scale) * kLog2e;
  uint32_t qa[kKSteps][4];
  float o[4 * kOTiles];
#pragma unroll
  for (int i = 0; i < 4 * kOTiles; ++i) o[i] = 0.f;
  OnlineSoftmaxRows softmax;
  const LaneRowKeys row_keys(a, b, q0 + warp * 16 + g);
  bool q_in_registers = false;
  int stage = 0;

  while (tile < n_tiles) {
    const int next = walk.next(tile + 1);
    if (next < n_tiles) {
      T* nk = sk + (stage ^ 1) * kKeyTile * D;
      T* nv = sv + (stage ^ 1) * kKeyTile * D;
      const int64_t next_key0 = int64_t{next} * kKeyTile;
      load_tile<kKeyTile, D, kThreads>(nk, kg, a.k_strides[2], next_key0, keys);
      load_tile<kKeyTile, D, kThreads>(nv, vg, a.v_strides[2], next_key0, keys);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning this stage
    cp_async_wait<1>();
    __syncthreads();
    if (!q_in_registers) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        ldmatrix_x4(qa[kk], sq + swizzled<D>(warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7),
                                             kk * 2 + (lane >> 4)));
      }
      q_in_registers = true;
    }
    const T* ks = sk + stage * kKeyTile * D;
    const T* vs = sv + stage * kKeyTile * D;

    // S = Q K^T for this warp's 16 rows x 64 keys.
    float s[4 * kSTiles];
#pragma unroll
    for (int i = 0; i < 4 * kSTiles; ++i) s[i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, ks + swizzled<D>(np * 16 + (lane >> 4) * 8 + (lane & 7),
                                         kk * 2 + ((lane >> 3) & 1)));
        mma<T>(&s[8 * np], qa[kk], kb[0], kb[1]);
        mma<T>(&s[8 * np + 4], qa[kk], kb[2], kb[3]);
      }
    }

    const float factor = mask_scores<kSTiles>(s, scale_log2, tile * kKeyTile, row_keys, t4);
    if (a.partial_index != nullptr) {
      mask_partial_bits<kSTiles>(s, a, b, h, q0 + warp * 16 + g, tile * kKeyTile, t4);
    }
    float corr[2];
    softmax.update<kSTiles>(s, factor, corr);
    OnlineSoftmaxRows::rescale<kOTiles>(o, corr);

    // O += P V: P's accumulator pairs become the A fragments directly.
#pragma unroll
    for (int kk = 0; kk < kKeyTile / 16; ++kk) {
      uint32_t pa[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[i] = pack2<T>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
#pragma unroll
      for (int np = 0; np < kOTiles / 2; ++np) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, vs + swizzled<D>(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7),
                                               np * 2 + (lane >> 4)));
        mma<T>(&o[8 * np], pa, vb[0], vb[1]);
        mma<T>(&o[8 * np + 4], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // this stage is refilled two iterations from now
    stage ^= 1;
    tile = next;
  }
  cp_async_wait<0>();  // nothing may stay in flight into shared memory at exit

  softmax.store<T, kOTiles>(a, qtile, o, q0 + warp * 16 + g, t4);
}

template <typename T, int D, int M>
KernelStatus launch(const BlockSparseAttentionArgs& a, cudaStream_t stream) {
  const int64_t q_tiles = ceil_div(a.q_len, M);
  const int64_t ctas = q_tiles * a.batch * a.heads * a.kv_splits;
  if (ctas == 0) return KernelStatus::ok();
  if (ctas > 0x7fffffff) return KernelStatus::invalid("too many query tiles for one grid");
  constexpr int kSmem = (M * D + 4 * kKeyTile * D) * static_cast<int>(sizeof(T));
  auto kernel = tensor_core_attention<T, D, M>;
  // Above 48 KiB, dynamic shared memory must be opted into per kernel.
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return to_status(err);
  kernel<<<static_cast<unsigned>(ctas), M / 16 * 32, kSmem, stream>>>(a, q_tiles);
  return launch_status();
}

template <typename T>
KernelStatus launch_for_dtype(const BlockSparseAttentionArgs& a, int rows, cudaStream_t s) {
  if (a.head_dim == 64) return rows == 128 ? launch<T, 64, 128>(a, s) : launch<T, 64, 64>(a, s);
  return rows == 128 ? launch<T, 128, 128>(a, s) : launch<T, 128, 64>(a, s);
}

}  // namespace

int64_t tensor_core_key_splits(const BlockSparseAttentionArgs& a) {
  // Two 64-row CTAs or one 128-row CTA per SM run at once (the Hopper
  // kernel's residency; the mma.sync kernel's is no lower), one 64-row CTA
  // with 256-wide heads.
  constexpr int64_t kMinSplitKeys = 512;  // a split's Q load and state write stay small next to it
  const int rows = tensor_core_tile_rows(a);
  if (rows == 0) return 1;
  const int64_t wave = multiprocessors() * (rows == 64 && a.head_dim <= 128 ? 2 : 1);
  const int64_t tiles = ceil_div(a.q_len, rows) * a.batch * a.heads;
  if (tiles == 0 || tiles * 2 > wave) return 1;
  // As many splits as fit in one wave: a second, partial wave would cost a
  // whole split's time for a few CTAs.
  return std::max<int64_t>(1, std::min(wave / tiles, a.k_len / kMinSplitKeys));
}

KernelStatus block_sparse_attention_tensor_core_cuda(const BlockSparseAttentionArgs& a,
                                                     void* stream) {
  const int rows = tensor_core_tile_rows(a);
  // Document ids and 256-wide heads are the Hopper kernels' only.
  if (rows == 0 || a.q_documents != nullptr || a.head_dim == 256) {
    return KernelStatus::invalid("problem not eligible for the tensor-core kernel");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  if (a.dtype == FloatDtype::kFloat16) return launch_for_dtype<__half>(a, rows, s);
  return launch_for_dtype<__nv_bfloat16>(a, rows, s);
}

}  // namespace baracuda
