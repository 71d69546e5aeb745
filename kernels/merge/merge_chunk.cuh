// Device pieces every CUDA merge kernel shares: head_dim chunks moved at
// storage width, and the final normalisation of a weighted sum. No torch
// headers.
#pragma once

#include <cstdint>

#include "common/compute_types.cuh"
#include "merge/merge_math.h"

namespace baracuda {
namespace merge {

// LSE storage: float32, except float64 with float64 states.
template <typename T> using lse_t = compute_t<T>;

// Chunk `chunk` of a head_dim vector at storage width: a lane holding several
// loads in flight keeps them unconverted (half the registers for 16-bit
// types, and registers decide occupancy here). VEC == 1 follows `stride`.
template <typename T, int VEC>
__device__ inline Pack<T, VEC> load_raw(const T* base, int64_t chunk, int64_t stride = 1) {
  if constexpr (VEC == 1) {
    return Pack<T, 1>{{base[chunk * stride]}};
  } else {
    return *reinterpret_cast<const Pack<T, VEC>*>(base + chunk * VEC);
  }
}

template <typename T, int VEC>
__device__ inline void load(const T* base, int64_t chunk, int64_t stride, compute_t<T> (&out)[VEC]) {
  const Pack<T, VEC> v = load_raw<T, VEC>(base, chunk, stride);
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] = to_compute(v.x[e]);
}

template <typename T, int VEC>
__device__ inline void store(T* base, int64_t chunk, int64_t stride, const compute_t<T> (&in)[VEC]) {
  if constexpr (VEC == 1) {
    base[chunk * stride] = from_compute<T>(in[0]);
  } else {
    Pack<T, VEC> v;
#pragma unroll
    for (int e = 0; e < VEC; ++e) v.x[e] = from_compute<T>(in[e]);
    *reinterpret_cast<Pack<T, VEC>*>(base + chunk * VEC) = v;
  }
}

// Weighted sum of one chunk, normalised. Accumulators start at -0, the
// identity of addition, and a state of weight 0 is never added: a lone state
// comes back bit for bit (signed zeros included), whatever an empty state
// holds. Every forward kernel finishes a chunk here, so the pair and the stack
// forms round alike. An undefined cell (merge_math.h) comes out NaN.
template <typename C, int VEC>
__device__ inline void normalise(C (&acc)[VEC], C total) {
  const C scale = inverse_total(total);
#pragma unroll
  for (int e = 0; e < VEC; ++e) acc[e] = merged_value(acc[e], total, scale);
}

// The weights of a pair of states: m the larger LSE, w_i = b^(s_i - m)
// (both 0 when both states are empty), total = w0 + w1 (NaN when either LSE
// is NaN or +inf).
template <typename C>
struct PairWeights {
  C m, w0, w1, total;
};

template <typename C>
__device__ inline PairWeights<C> pair_weights(C s0, C s1, C log2_scale) {
  PairWeights<C> w{merge_max(s0, s1), C(0), C(0), C(0)};
  if (w.m != neg_infinity<C>()) {
    w.w0 = state_weight<C>(s0, w.m, log2_scale);
    w.w1 = state_weight<C>(s1, w.m, log2_scale);
  }
  w.total = w.w0 + w.w1;
  return w;
}

// acc += w * x over one chunk, where a state of weight 0 adds nothing at all
// (whatever its v holds, NaN included). A select, not a branch: around a
// branch the compiler converted whole batches of a stack to float32 first
// (128 registers for bf16 instead of 44).
template <typename T, int VEC>
__device__ inline void add_weighted(compute_t<T> (&acc)[VEC], compute_t<T> w,
                                    const Pack<T, VEC>& x) {
#pragma unroll
  for (int e = 0; e < VEC; ++e) acc[e] = w != 0 ? acc[e] + w * to_compute(x.x[e]) : acc[e];
}

}  // namespace merge
}  // namespace baracuda
