// The per-cell arithmetic of the merge, shared by the CPU and CUDA kernels.
#pragma once

#include <cmath>

#include "common/unit_types.h"

namespace baracuda {

template <typename C>
BARACUDA_HOST_DEVICE inline C merge_exp2(C x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(C) == 4) return exp2f(x); else return exp2(x);
#else
  return std::exp2(x);
#endif
}

template <typename C>
BARACUDA_HOST_DEVICE inline C merge_log2(C x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(C) == 4) return log2f(x); else return log2(x);
#else
  return std::log2(x);
#endif
}

template <typename C>
BARACUDA_HOST_DEVICE inline C neg_infinity() {
  return -static_cast<C>(INFINITY);
}

// Weight of a state with LSE s in a cell whose largest LSE is m (> -inf):
// b^(s - m), computed in base 2. Exactly 0 for an empty state (s = -inf).
template <typename C>
BARACUDA_HOST_DEVICE inline C state_weight(C s, C m, C log2_scale) {
  return merge_exp2((s - m) * log2_scale);
}

// Factor that turns the weighted sum into the merged vector: 1 / W (callers
// write +0 themselves where W == 0, a cell of empty states). A multiply, not
// a divide, per element: the divide was most of the bf16 kernel's
// instructions. Exact where exactness is promised, since a lone non-empty
// state has W == 1 exactly.
template <typename C>
BARACUDA_HOST_DEVICE inline C inverse_total(C total_weight) {
  return total_weight > 0 ? C(1) / total_weight : C(0);
}

// LSE of the merged cell: m + log_b(W). W >= 1 whenever m > -inf, and
// W == 1 (one non-empty state) gives m exactly.
template <typename C>
BARACUDA_HOST_DEVICE inline C merged_lse(C m, C total_weight, C log2_scale) {
  if (m == neg_infinity<C>()) return m;
  return m + merge_log2(total_weight) / log2_scale;
}

}  // namespace baracuda
