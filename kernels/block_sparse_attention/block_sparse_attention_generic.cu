// Generic CUDA executor of block-sparse attention: any dtype, head dims up to
// 256, any block sizes and strides. The correctness path behind the
// tensor-core kernel, not a fast one.
//
// A query row belongs to one warp, or, when there are too few rows to fill
// the GPU, to all kWarpsPerCta warps of a CTA, which then take its keys in
// turns of kGroup (warp w the w-th of every kWarpsPerCta groups) and merge
// their softmax states in warp order at the end: a warp issues about a
// hundred dependent instructions per key, so on a short problem the time is
// the length of each warp's key chain. Both orders are fixed, so results
// keep their bits run to run.
//
// Lane l holds q[d] and the output accumulator for d = l, l + 32, ...
// (kChunks of each, the fewest that cover the head dims: the unused ones of
// a fixed 8 cost most of the instructions at D = 64); a key's score is a
// warp-wide sum, and the online softmax runs key by key in registers. Keys
// go in groups of up to kGroup: their K and V loads and their warp sums are
// independent, so they overlap, and the softmax then takes them one by one
// in order (the same bits as one key at a time). Without the split, warps
// of one CTA take neighbouring rows of one head, so they share the K/V
// lines in L1/L2.
#include <cuda_runtime.h>

#include <cmath>

#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "common/compute_types.cuh"
#include "common/cuda_launch.cuh"
#include "common/warp_sum.cuh"

namespace baracuda {
namespace {

constexpr int kWarpsPerCta = 4;
// Warps an SM holds at once (64 on most GPUs since Volta; an estimate is enough).
constexpr int64_t kResidentWarpsPerSm = 64;
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

// With `split`, every warp of the CTA works on the CTA's one row.
template <typename T, int kChunks>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    generic_attention(const BlockSparseAttentionArgs a, int64_t rows, bool split) {
  using C = compute_t<T>;
  // Keys per group: the group's K and V elements live in registers.
  constexpr int kGroup = sizeof(C) * kChunks > 32 ? 2 : 4;
  // The split warps' softmax states, merged by warp 0.
  __shared__ C part_m[kWarpsPerCta], part_l[kWarpsPerCta];
  __shared__ C part_acc[kWarpsPerCta][kChunks * 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int rows_per_cta = split ? 1 : kWarpsPerCta;
  const int turns = split ? kWarpsPerCta : 1, my_turn = split ? warp : 0;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  // Scores are kept in log2 units: the scale and log2(e) fold into q once.
  const C scale_log2 = static_cast<C>(a.scale * kLog2e);
  const int64_t group = a.heads / a.kv_heads;
  // Uniform over the CTA with `split` (the barriers below need it).
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_cta + (split ? 0 : warp); row < rows;
       row += static_cast<int64_t>(gridDim.x) * rows_per_cta) {
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
    // branches are uniform and warp_sum sees all 32 lanes. With the split,
    // the row's visible keys, numbered in order, go in turns of kGroup: warp
    // w keeps those at positions p with (p / kGroup) % kWarpsPerCta == w,
    // stepping from one of its groups to the next inside each run of keys
    // (so that no warp spends time on the keys of the others).
    int64_t seen = 0;  // visible keys before the current run
    for_each_visible_run(a, b, h, i, [&](int64_t j_begin, int64_t j_end) {
      const int64_t run_end = seen + (j_end - j_begin);
      const int64_t g = seen / kGroup;
      const int ahead =
          split ? (my_turn - static_cast<int>(g % kWarpsPerCta) + kWarpsPerCta) % kWarpsPerCta : 0;
      for (int64_t p = ahead == 0 ? seen : (g + ahead) * kGroup; p < run_end;) {
        const int64_t j = j_begin + (p - seen);
        // keys[pending] = j, with constant indices: the group stays in registers.
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          if (u == pending) keys[u] = j;
        }
        if (++pending == kGroup) run_group();
        if (++p % kGroup == 0) p += (turns - 1) * kGroup;
      }
      seen = run_end;
    });
    if (pending > 0) run_group();
    if (split) {
      // Warp 0 merges the states in warp order. A warp that saw no key has
      // m = -inf and l = 0 and weighs 0; a NaN in any l or acc survives the
      // weighting (NaN * 0 is NaN) and reaches both outputs.
#pragma unroll
      for (int c = 0; c < kChunks; ++c) part_acc[warp][lane + 32 * c] = acc[c];
      if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
      }
      __syncthreads();
      if (warp == 0) {
        C m_all = part_m[0];
#pragma unroll
        for (int w = 1; w < kWarpsPerCta; ++w) m_all = max(m_all, part_m[w]);
        l = 0;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) acc[c] = 0;
#pragma unroll
        for (int w = 0; w < kWarpsPerCta; ++w) {
          const C weight = part_m[w] == -static_cast<C>(INFINITY) ? C(0) : exp2(part_m[w] - m_all);
          l += part_l[w] * weight;
#pragma unroll
          for (int c = 0; c < kChunks; ++c) acc[c] += part_acc[w][lane + 32 * c] * weight;
        }
        m = m_all;
      }
    }
    if (!split || warp == 0) {
      // Only a row that saw no key has l == 0: the empty state, lse = -inf.
      // A NaN score leaves l NaN, which then reaches both outputs.
      const bool empty = l == C(0);
      T* oi = static_cast<T*>(a.out) + b * a.out_strides[0] + h * a.out_strides[1] +
              i * a.out_strides[2];
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
    if (split) __syncthreads();  // warp 0 has read the states before they are rewritten
  }
}

template <typename T, int kChunks>
KernelStatus launch_chunks(const BlockSparseAttentionArgs& a, int64_t rows, cudaStream_t stream) {
  // Split the keys of each row over the CTA's warps when one warp per row
  // leaves most of the GPU idle: no more rows than a quarter of the warps
  // it holds at once.
  const bool split = rows * kWarpsPerCta <= multiprocessors() * kResidentWarpsPerSm;
  const int64_t rows_per_cta = split ? 1 : kWarpsPerCta;
  // Rows beyond the grid are taken by the grid-stride loop.
  const int64_t ctas = std::min<int64_t>(ceil_div(rows, rows_per_cta), int64_t{1} << 20);
  generic_attention<T, kChunks>
      <<<static_cast<unsigned>(ctas), kWarpsPerCta * 32, 0, stream>>>(a, rows, split);
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
