// The per-cell arithmetic of the merge, shared by the CPU and CUDA kernels.
//
// An LSE of NaN or +inf leaves its cell undefined: NaN is no weight at all,
// and +inf an infinite one, whose share of the cell is inf / inf. Such a
// cell merges to (NaN, NaN), and every gradient reaching its states is NaN.
// It shows as a NaN total weight W: the largest LSE m is NaN (merge_max
// keeps a NaN) or +inf, so b^(s - m) is NaN for that state, while in a
// defined cell W is 0 (all states empty) or at least 1 (a finite m).
#pragma once

#include <algorithm>
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

// The larger of two LSEs, or NaN if either is NaN: fmax and std::max would
// drop a NaN, and a cell of NaN and empty states would merge as an empty one.
template <typename C>
BARACUDA_HOST_DEVICE inline C merge_max(C a, C b) {
  if (a != a || b != b) return a + b;
#if defined(__CUDA_ARCH__)
  return fmax(a, b);
#else
  return std::max(a, b);
#endif
}

// Weight of a state with LSE s in a cell whose largest LSE is m (> -inf):
// b^(s - m), computed in base 2. Exactly 0 for an empty state (s = -inf).
template <typename C>
BARACUDA_HOST_DEVICE inline C state_weight(C s, C m, C log2_scale) {
  return merge_exp2((s - m) * log2_scale);
}

// Factor that turns the weighted sum into the merged vector: 1 / W (NaN in
// an undefined cell; callers write +0 themselves where W == 0, a cell of
// empty states). A multiply, not a divide, per element: the divide was most
// of the bf16 kernel's instructions. Exact where exactness is promised,
// since a lone non-empty state has W == 1 exactly.
template <typename C>
BARACUDA_HOST_DEVICE inline C inverse_total(C total_weight) {
  return total_weight != 0 ? C(1) / total_weight : C(0);
}

// Element of the merged vector from its weighted sum: +0 in a cell of empty
// states, NaN in an undefined one (scale is NaN there).
template <typename C>
BARACUDA_HOST_DEVICE inline C merged_value(C weighted_sum, C total_weight, C scale) {
  return total_weight != 0 ? weighted_sum * scale : C(0);
}

// Share p = w / W of a state in its cell, for the backward: 0 for a state
// of weight 0 in a defined cell (empty states get zero gradients), NaN for
// every state of an undefined cell.
template <typename C>
BARACUDA_HOST_DEVICE inline C state_share(C w, C total_weight) {
  return w != 0 || total_weight != total_weight ? w / total_weight : C(0);
}

// LSE of the merged cell: m + log_b(W). W >= 1 whenever m is finite, and
// W == 1 (one non-empty state) gives m exactly; a NaN W gives NaN.
template <typename C>
BARACUDA_HOST_DEVICE inline C merged_lse(C m, C total_weight, C log2_scale) {
  if (m == neg_infinity<C>()) return m;
  return m + merge_log2(total_weight) / log2_scale;
}

}  // namespace baracuda
