// Generic CUDA executor of block-sparse attention's backward pass: any dtype,
// head dims up to 256, any block sizes and strides. The correctness path
// behind the tensor-core kernels, laid out as the generic forward is: a warp
// per row, lane l holding elements d = l, l + 32, ... of the row's vectors.
//
// Three launches (the first shared with the tensor-core executor), none of
// which writes an element another thread writes, so the result is the same
// bits on every run:
//   1. the per-row scratch: delta_i = <do_i, out_i> - dlse_i and lse in log2
//      units, a warp per query row;
//   2. dq, a warp per query row walking the keys the row sees (the forward's
//      walk), recomputing P from the saved lse;
//   3. dk and dv, a warp per key walking the query rows that see it: for each
//      query head of its group, the query blocks whose mask byte for the
//      key's block is on (the mask's column, read in place: nothing is built
//      or allocated for it), and only the rows whose position range holds
//      the key (causal, window) and, with document ids, of its document.
#include <cuda_runtime.h>

#include <cmath>

#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "common/compute_types.cuh"
#include "common/cuda_launch.cuh"
#include "common/warp_sum.cuh"

namespace baracuda {
namespace {

constexpr int kWarpsPerCta = 4;
constexpr int kPerLane = 256 / 32;  // the largest head dim, spread over a warp
constexpr double kLog2e = 1.4426950408889634;

// This lane's elements of a strided vector of `n` elements, in compute
// precision, times `factor` (0 past the end).
template <typename T, typename C>
__device__ inline void load_lanes(C (&r)[kPerLane], const T* x, int64_t stride, int64_t n, int lane,
                                  C factor = C(1)) {
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t d = lane + 32 * c;
    r[c] = d < n ? to_compute(x[d * stride]) * factor : C(0);
  }
}

template <typename T, typename C>
__device__ inline C dot_lanes(const C (&r)[kPerLane], const T* x, int64_t stride, int64_t n,
                              int lane) {
  C part = 0;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < n) part += r[c] * to_compute(x[d * stride]);
  }
  return warp_sum(part);
}

template <typename T, typename C>
__device__ inline void store_lanes(T* x, const C (&r)[kPerLane], int64_t n, int lane, C factor) {
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < n) x[d] = from_compute<T>(r[c] * factor);
  }
}

// The per-row scratch of query row i of head h in batch b.
template <typename C>
struct RowStats {
  C lse_log2;  // +inf for a row that saw no key, so P = 0
  C delta;
};

template <typename C>
__device__ inline RowStats<C> row_stats(const BlockSparseAttentionBackwardArgs& ba, int64_t b,
                                        int64_t h, int64_t i) {
  const int64_t at = (b * ba.forward.heads + h) * ba.rows_stride + i;
  return {static_cast<const C*>(ba.lse_log2)[at], static_cast<const C*>(ba.delta)[at]};
}

// delta and lse_log2 of every row of the scratch, padding rows included.
template <typename T>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    row_scratch(const BlockSparseAttentionBackwardArgs ba, int64_t rows) {
  using C = compute_t<T>;
  const BlockSparseAttentionArgs& a = ba.forward;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerCta;
  const C inf = static_cast<C>(INFINITY);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32; row < rows;
       row += warps) {
    const int64_t i = row % ba.rows_stride, bh = row / ba.rows_stride;
    const int64_t h = bh % a.heads, b = bh / a.heads;
    C delta = 0, lse_log2 = inf;
    if (i < a.q_len) {
      C o[kPerLane];
      load_lanes(o, static_cast<const T*>(ba.out) + b * ba.out_strides[0] + h * ba.out_strides[1] +
                        i * ba.out_strides[2],
                 ba.out_strides[3], a.v_dim, lane);
      delta = dot_lanes(o, static_cast<const T*>(ba.grad_out) + b * ba.grad_out_strides[0] +
                               h * ba.grad_out_strides[1] + i * ba.grad_out_strides[2],
                        ba.grad_out_strides[3], a.v_dim, lane);
      if (ba.grad_lse != nullptr) {
        delta -= static_cast<const C*>(ba.grad_lse)[b * ba.grad_lse_strides[0] +
                                                    h * ba.grad_lse_strides[1] +
                                                    i * ba.grad_lse_strides[2]];
      }
      const C lse = static_cast<const C*>(ba.lse)[b * ba.lse_strides[0] + h * ba.lse_strides[1] +
                                                  i * ba.lse_strides[2]];
      lse_log2 = lse == -inf ? inf : lse * static_cast<C>(kLog2e);
    }
    if (lane == 0) {
      static_cast<C*>(ba.delta)[row] = delta;
      static_cast<C*>(ba.lse_log2)[row] = lse_log2;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    grad_q_rows(const BlockSparseAttentionBackwardArgs ba, int64_t rows) {
  using C = compute_t<T>;
  const BlockSparseAttentionArgs& a = ba.forward;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerCta;
  const C scale_log2 = static_cast<C>(a.scale * kLog2e);
  const int64_t group = a.heads / a.kv_heads;
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32; row < rows;
       row += warps) {
    const int64_t i = row % a.q_len, bh = row / a.q_len;
    const int64_t h = bh % a.heads, b = bh / a.heads, g = h / group;
    const RowStats<C> st = row_stats<C>(ba, b, h, i);
    C qr[kPerLane], dor[kPerLane], dq[kPerLane];
    load_lanes(qr, static_cast<const T*>(a.q) + b * a.q_strides[0] + h * a.q_strides[1] +
                       i * a.q_strides[2],
               a.q_strides[3], a.head_dim, lane, scale_log2);
    load_lanes(dor, static_cast<const T*>(ba.grad_out) + b * ba.grad_out_strides[0] +
                        h * ba.grad_out_strides[1] + i * ba.grad_out_strides[2],
               ba.grad_out_strides[3], a.v_dim, lane);
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) dq[c] = 0;
    const T* kbase = k + b * a.k_strides[0] + g * a.k_strides[1];
    const T* vbase = v + b * a.v_strides[0] + g * a.v_strides[1];
    // The forward's walk (uniform across the warp); a row that saw no key
    // visits none now either.
    if (st.lse_log2 != static_cast<C>(INFINITY)) {
      for_each_visible_key(a, b, h, i, [&](int64_t j) {
        const T* kj = kbase + j * a.k_strides[2];
        const C s = dot_lanes(qr, kj, a.k_strides[3], a.head_dim, lane);
        const C dp = dot_lanes(dor, vbase + j * a.v_strides[2], a.v_strides[3], a.v_dim, lane);
        const C ds = exp2(s - st.lse_log2) * (dp - st.delta);
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) {
          const int64_t d = lane + 32 * c;
          if (d < a.head_dim) dq[c] += ds * to_compute(kj[d * a.k_strides[3]]);
        }
      });
    }
    store_lanes(static_cast<T*>(ba.grad_q) + row * a.head_dim, dq, a.head_dim, lane,
                static_cast<C>(a.scale));
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    grad_kv_rows(const BlockSparseAttentionBackwardArgs ba, int64_t keys) {
  using C = compute_t<T>;
  const BlockSparseAttentionArgs& a = ba.forward;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerCta;
  const C scale_log2 = static_cast<C>(a.scale * kLog2e);
  const int64_t group = a.heads / a.kv_heads;
  const T* q = static_cast<const T*>(a.q);
  const T* dout = static_cast<const T*>(ba.grad_out);
  for (int64_t key = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32; key < keys;
       key += warps) {
    const int64_t j = key % a.k_len, bg = key / a.k_len;
    const int64_t g = bg % a.kv_heads, b = bg / a.kv_heads;
    const int64_t kb = j / a.block_k;
    // The rows that may see the key by position (kv_lens, causal, window);
    // a key no row sees (past kv_lens, say) is not even read.
    int64_t row_lo, row_hi;
    visible_row_range(a, b, j, row_lo, row_hi);
    C kr[kPerLane], vr[kPerLane], dk[kPerLane], dv[kPerLane];
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) kr[c] = vr[c] = dk[c] = dv[c] = 0;
    if (row_lo < row_hi) {
      load_lanes(kr, static_cast<const T*>(a.k) + b * a.k_strides[0] + g * a.k_strides[1] +
                         j * a.k_strides[2],
                 a.k_strides[3], a.head_dim, lane, scale_log2);
      load_lanes(vr, static_cast<const T*>(a.v) + b * a.v_strides[0] + g * a.v_strides[1] +
                         j * a.v_strides[2],
                 a.v_strides[3], a.v_dim, lane);
    }
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const T* qbase = q + b * a.q_strides[0] + h * a.q_strides[1];
      const T* dobase = dout + b * ba.grad_out_strides[0] + h * ba.grad_out_strides[1];
      for (int64_t qb = row_lo / a.block_q; qb * a.block_q < row_hi; ++qb) {
        if (!key_block_on(a, mask_row(a, b, h, qb), kb)) continue;  // uniform across the warp
        const int64_t i_end = min(row_hi, (qb + 1) * a.block_q);
        for (int64_t i = max(row_lo, qb * a.block_q); i < i_end; ++i) {
          if (!element_visible(a, b, h, i, j)) continue;  // uniform across the warp
          const RowStats<C> st = row_stats<C>(ba, b, h, i);
          const T* qi = qbase + i * a.q_strides[2];
          const T* doi = dobase + i * ba.grad_out_strides[2];
          const C s = dot_lanes(kr, qi, a.q_strides[3], a.head_dim, lane);
          const C dp = dot_lanes(vr, doi, ba.grad_out_strides[3], a.v_dim, lane);
          const C p = exp2(s - st.lse_log2);
          const C ds = p * (dp - st.delta);
#pragma unroll
          for (int c = 0; c < kPerLane; ++c) {
            const int64_t d = lane + 32 * c;
            if (d < a.head_dim) dk[c] += ds * to_compute(qi[d * a.q_strides[3]]);
            if (d < a.v_dim) dv[c] += p * to_compute(doi[d * ba.grad_out_strides[3]]);
          }
        }
      }
    }
    store_lanes(static_cast<T*>(ba.grad_k) + key * a.head_dim, dk, a.head_dim, lane,
                static_cast<C>(a.scale));
    store_lanes(static_cast<T*>(ba.grad_v) + key * a.v_dim, dv, a.v_dim, lane, C(1));
  }
}

// A grid of warps over `items` rows; those beyond it are taken by the
// grid-stride loops.
inline unsigned warp_grid(int64_t items) {
  return static_cast<unsigned>(std::min<int64_t>(ceil_div(items, kWarpsPerCta), int64_t{1} << 20));
}

template <typename T>
KernelStatus launch(const BlockSparseAttentionBackwardArgs& ba, cudaStream_t stream) {
  const BlockSparseAttentionArgs& a = ba.forward;
  const int64_t rows = a.batch * a.heads * a.q_len;
  const int64_t keys = a.batch * a.kv_heads * a.k_len;
  constexpr int kThreads = kWarpsPerCta * 32;
  if (rows > 0) {
    grad_q_rows<T><<<warp_grid(rows), kThreads, 0, stream>>>(ba, rows);
    const KernelStatus st = launch_status();
    if (!st.is_ok()) return st;
  }
  if (keys > 0) {
    grad_kv_rows<T><<<warp_grid(keys), kThreads, 0, stream>>>(ba, keys);
    return launch_status();
  }
  return KernelStatus::ok();
}

template <typename T>
KernelStatus launch_rows(const BlockSparseAttentionBackwardArgs& ba, cudaStream_t stream) {
  const int64_t rows = ba.forward.batch * ba.forward.heads * ba.rows_stride;
  if (rows == 0) return KernelStatus::ok();
  row_scratch<T><<<warp_grid(rows), kWarpsPerCta * 32, 0, stream>>>(ba, rows);
  return launch_status();
}

}  // namespace

KernelStatus block_sparse_attention_backward_rows_cuda(const BlockSparseAttentionBackwardArgs& a,
                                                       void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_float_dtype<__half, __nv_bfloat16>(a.forward.dtype, [&](auto t) {
    return launch_rows<decltype(t)>(a, s);
  });
}

KernelStatus block_sparse_attention_backward_generic_cuda(const BlockSparseAttentionBackwardArgs& a,
                                                          void* stream) {
  if (a.forward.head_dim > 256 || a.forward.v_dim > 256) {
    return KernelStatus::invalid("head dims above 256");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_float_dtype<__half, __nv_bfloat16>(a.forward.dtype, [&](auto t) {
    return launch<decltype(t)>(a, s);
  });
}

}  // namespace baracuda
