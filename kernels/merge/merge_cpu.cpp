// Host executors of the merge launch contracts (merge_kernels.h), for
// float32 and float64 tensors; the op layer upcasts half types first.
#include <cmath>
#include <vector>

#include "merge/merge_kernels.h"
#include "merge/merge_math.h"

namespace baracuda {
namespace {

int64_t cell_count(const CellGrid& g) {
  int64_t n = 1;
  for (int d = 0; d < g.rank; ++d) n *= g.sizes[d];
  return n;
}

// Offset of cell `c` in a tensor with the given cell strides.
int64_t cell_offset(const CellGrid& g, const int64_t* strides, int64_t c) {
  int64_t off = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    off += (c % g.sizes[d]) * strides[d];
    c /= g.sizes[d];
  }
  return off;
}

template <typename C>
void forward(const MergeForwardArgs& a) {
  const int64_t cells = cell_count(a.cells);
  const C k = static_cast<C>(a.log2_scale);
  const int64_t n = a.num_states, D = a.head_dim;
  std::vector<C> acc(D);
  for (int64_t c = 0; c < cells; ++c) {
    int64_t off[kFwCount];
    for (int t = 0; t < kFwCount; ++t) off[t] = cell_offset(a.cells, a.cell_strides[t], c);
    auto v_of = [&](int64_t i) -> const C* {
      if (a.stacked) return static_cast<const C*>(a.v[0]) + off[kFwV0] + i * a.v_state_stride;
      return static_cast<const C*>(a.v[i]) + off[kFwV0 + i];
    };
    auto s_of = [&](int64_t i) -> C {
      if (a.stacked) return static_cast<const C*>(a.s[0])[off[kFwS0] + i * a.s_state_stride];
      return static_cast<const C*>(a.s[i])[off[kFwS0 + i]];
    };
    C m = neg_infinity<C>();
    for (int64_t i = 0; i < n; ++i) m = merge_max(m, s_of(i));
    C total = 0;
    // -0 is the identity of addition: a lone state comes back bit for bit.
    for (int64_t j = 0; j < D; ++j) acc[j] = -C(0);
    if (m != neg_infinity<C>()) {
      for (int64_t i = 0; i < n; ++i) {
        const C w = state_weight(s_of(i), m, k);
        total += w;
        if (w == 0) continue;
        const C* vi = v_of(i);
        const int64_t stride = a.inner_strides[a.stacked ? kFwV0 : kFwV0 + i];
        for (int64_t j = 0; j < D; ++j) acc[j] += w * vi[j * stride];
      }
    }
    // Results are written only after every input of the cell was read, so
    // the in-place form (outputs aliasing state 0) is safe.
    C* vo = static_cast<C*>(a.v_out) + off[kFwVOut];
    const C scale = inverse_total(total);
    for (int64_t j = 0; j < D; ++j) {
      vo[j * a.inner_strides[kFwVOut]] = merged_value(acc[j], total, scale);
    }
    static_cast<C*>(a.s_out)[off[kFwSOut]] = merged_lse(m, total, k);
  }
}

template <typename C>
void backward(const MergeBackwardArgs& a) {
  const int64_t cells = cell_count(a.cells);
  const C k = static_cast<C>(a.log2_scale);
  const C ln_b = static_cast<C>(std::log(2.0) * a.log2_scale);
  const int64_t n = a.num_states, D = a.head_dim;
  for (int64_t c = 0; c < cells; ++c) {
    int64_t off[kBwCount];
    for (int t = 0; t < kBwCount; ++t) off[t] = cell_offset(a.cells, a.cell_strides[t], c);
    auto pick = [&](const void* const* ptrs, int slot, int64_t state_stride, int64_t i) {
      return a.stacked ? static_cast<const C*>(ptrs[0]) + off[slot] + i * state_stride
                       : static_cast<const C*>(ptrs[i]) + off[slot + i];
    };
    auto pick_out = [&](void* const* ptrs, int slot, int64_t state_stride, int64_t i) {
      return a.stacked ? static_cast<C*>(ptrs[0]) + off[slot] + i * state_stride
                       : static_cast<C*>(ptrs[i]) + off[slot + i];
    };
    auto inner = [&](int slot, int64_t i) {
      return a.inner_strides[a.stacked ? slot : slot + i];
    };
    const C* gv = static_cast<const C*>(a.grad_v) + off[kBwGradV];
    const C gs = a.grad_s ? static_cast<const C*>(a.grad_s)[off[kBwGradS]] : C(0);
    C m = neg_infinity<C>();
    for (int64_t i = 0; i < n; ++i) m = merge_max(m, *pick(a.s, kBwS0, a.s_state_stride, i));
    C total = 0;
    if (m != neg_infinity<C>()) {
      for (int64_t i = 0; i < n; ++i) {
        total += state_weight(*pick(a.s, kBwS0, a.s_state_stride, i), m, k);
      }
    }
    C dbar = 0;
    for (int64_t i = 0; i < n; ++i) {
      const C w = m == neg_infinity<C>()
                      ? C(0)
                      : state_weight(*pick(a.s, kBwS0, a.s_state_stride, i), m, k);
      const C p = state_share(w, total);
      const C* vi = pick(a.v, kBwV0, a.v_state_stride, i);
      C* gvi = pick_out(a.grad_vin, kBwGradV0, a.grad_v_state_stride, i);
      C d = 0;
      for (int64_t j = 0; j < D; ++j) {
        const C g = gv[j * a.inner_strides[kBwGradV]];
        if (p != 0) d += g * vi[j * inner(kBwV0, i)];
        gvi[j * inner(kBwGradV0, i)] = p * g;
      }
      // First half of grad_s_i; the dbar term is subtracted once dbar is known.
      *pick_out(a.grad_sin, kBwGradS0, a.grad_s_state_stride, i) = p != 0 ? p * (gs + ln_b * d) : C(0);
      dbar += p * d;
    }
    for (int64_t i = 0; i < n; ++i) {
      const C w = m == neg_infinity<C>()
                      ? C(0)
                      : state_weight(*pick(a.s, kBwS0, a.s_state_stride, i), m, k);
      const C p = state_share(w, total);
      if (p != 0) *pick_out(a.grad_sin, kBwGradS0, a.grad_s_state_stride, i) -= p * ln_b * dbar;
    }
  }
}

}  // namespace

KernelStatus merge_forward_cpu(const MergeForwardArgs& a) {
  if (a.dtype == FloatDtype::kFloat32) { forward<float>(a); return KernelStatus::ok(); }
  if (a.dtype == FloatDtype::kFloat64) { forward<double>(a); return KernelStatus::ok(); }
  return KernelStatus::invalid("the host merge takes float32 or float64 states");
}

KernelStatus merge_backward_cpu(const MergeBackwardArgs& a) {
  if (a.dtype == FloatDtype::kFloat32) { backward<float>(a); return KernelStatus::ok(); }
  if (a.dtype == FloatDtype::kFloat64) { backward<double>(a); return KernelStatus::ok(); }
  return KernelStatus::invalid("the host merge backward takes float32 or float64 states");
}

}  // namespace baracuda
