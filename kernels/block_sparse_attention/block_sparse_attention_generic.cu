// Generic CUDA executor of block-sparse attention: any dtype, head dims up to
// 256, any block sizes and strides. The correctness path behind the
// tensor-core kernel, not a fast one.
//
// One warp per query row. Lane l holds q[d] and the output accumulator for
// d = l, l + 32, ... (kChunks of each, the fewest that cover the head dims:
// the unused ones of a fixed 8 cost most of the instructions at D = 64); a
// key's score is a warp-wide sum, and the online softmax runs key by key in
// registers. Keys go in groups of up to kGroup: their K and V loads and
// their warp sums are independent, so they overlap, and the softmax then
// takes them one by one in order (the same bits as one key at a time).
// Warps of one CTA take neighbouring rows of one head, so they share the
// K/V lines in L1/L2.
#include <cuda_runtime.h>

#include <cmath>

#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "common/compute_types.cuh"
#include "common/cuda_launch.cuh"
#include "common/warp_sum.cuh"

namespace baracuda {
namespace {

constexpr int kWarpsPerCta = 4;
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

template <typename T, int kChunks>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    generic_attention(const BlockSparseAttentionArgs a, int64_t rows) {
  using C = compute_t<T>;
  // Keys per group: the group's K and V elements live in registers.
  constexpr int kGroup = sizeof(C) * kChunks > 32 ? 2 : 4;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerCta;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  // Scores are kept in log2 units: the scale and log2(e) fold into q once.
  const C scale_log2 = static_cast<C>(a.scale * kLog2e);
  const int64_t group = a.heads / a.kv_heads;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32; row < rows;
       row += warps) {
    const int64_t i = row % a.q_len;
    const int64_t bh = row / a.q_len;
    const int64_t h = bh % a.heads, b = bh / a.heads, g = h / group;
    const T* qi = q + b * a.q_strides[0] + h * a.q_strides[1] + i * a.q_strides[2];
    const T* kbase = k + b * a.k_strides[0] + g * a.k_strides[1];
    const T* vbase = v + b * a.v_strides[0] + g * a.v_strides[1];
    C qr[kChunks], acc[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t d = lane + 32 * c;
      qr[c] = d < a.head_dim ? to_compute(qi[d * a.q_strides[3]]) * scale_log2 : C(0);
      acc[c] = 0;
    }
    C m = -static_cast<C>(INFINITY), l = 0;
    int64_t keys[kGroup];
    int pending = 0;
    // The pending keys' scores and values, then their softmax steps in order.
    auto run_group = [&] {
      C part[kGroup], vals[kGroup][kChunks];
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        part[u] = 0;
        if (u < pending) {
          const T* kj = kbase + keys[u] * a.k_strides[2];
          const T* vj = vbase + keys[u] * a.v_strides[2];
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int64_t d = lane + 32 * c;
            if (d < a.head_dim) part[u] += qr[c] * to_compute(kj[d * a.k_strides[3]]);
            vals[u][c] = d < a.v_dim ? to_compute(vj[d * a.v_strides[3]]) : C(0);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kGroup; ++u) part[u] = warp_sum(part[u]);
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        if (u < pending) {
          const C s = part[u];
          const C m_new = max(m, s);
          const C corr = exp2(m - m_new);  // 0 on the first key (m = -inf)
          const C p = exp2(s - m_new);
          l = l * corr + p;
#pragma unroll
          for (int c = 0; c < kChunks; ++c) acc[c] = acc[c] * corr + p * vals[u][c];
          m = m_new;
        }
      }
      pending = 0;
    };
    // The walk is the same for every lane of the warp (one row), so its
    // branches are uniform and warp_sum sees all 32 lanes.
    for_each_visible_key(a, b, h, i, [&](int64_t j) {
      // keys[pending] = j, with constant indices: the group stays in registers.
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        if (u == pending) keys[u] = j;
      }
      if (++pending == kGroup) run_group();
    });
    if (pending > 0) run_group();
    // Only a row that saw no key has l == 0: the empty state, lse = -inf. A
    // NaN score leaves l NaN, which then reaches both outputs.
    const bool empty = l == C(0);
    T* oi = static_cast<T*>(a.out) + b * a.out_strides[0] + h * a.out_strides[1] + i * a.out_strides[2];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t e = lane + 32 * c;
      if (e < a.v_dim) oi[e * a.out_strides[3]] = from_compute<T>(empty ? C(0) : acc[c] / l);
    }
    if (lane == 0) {
      static_cast<C*>(a.lse)[b * a.lse_strides[0] + h * a.lse_strides[1] + i * a.lse_strides[2]] =
          empty ? -static_cast<C>(INFINITY) : (m + log2(l)) * static_cast<C>(kLn2);
    }
  }
}

template <typename T, int kChunks>
KernelStatus launch_chunks(const BlockSparseAttentionArgs& a, int64_t rows, cudaStream_t stream) {
  // Rows beyond the grid are taken by the grid-stride loop.
  const int64_t ctas = std::min<int64_t>(ceil_div(rows, kWarpsPerCta), int64_t{1} << 20);
  generic_attention<T, kChunks>
      <<<static_cast<unsigned>(ctas), kWarpsPerCta * 32, 0, stream>>>(a, rows);
  return launch_status();
}

template <typename T>
KernelStatus launch(const BlockSparseAttentionArgs& a, cudaStream_t stream) {
  const int64_t rows = a.batch * a.heads * a.q_len;
  if (rows == 0) return KernelStatus::ok();
  const int64_t dims = std::max(a.head_dim, a.v_dim);
  if (dims <= 32) return launch_chunks<T, 1>(a, rows, stream);
  if (dims <= 64) return launch_chunks<T, 2>(a, rows, stream);
  if (dims <= 128) return launch_chunks<T, 4>(a, rows, stream);
  return launch_chunks<T, 8>(a, rows, stream);
}

}  // namespace

KernelStatus block_sparse_attention_generic_cuda(const BlockSparseAttentionArgs& a, void* stream) {
  if (a.head_dim > 256 || a.v_dim > 256) return KernelStatus::invalid("head dims above 256");
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_float_dtype<__half, __nv_bfloat16>(a.dtype, [&](auto t) {
    return launch<decltype(t)>(a, s);
  });
}

}  // namespace baracuda
