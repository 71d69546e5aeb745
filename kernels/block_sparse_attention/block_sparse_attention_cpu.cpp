// Host executor of block-sparse attention (float32 / float64): for each query
// row, an online softmax over the keys of its visible key blocks. Memory is
// O(head dims): no score matrix is ever formed.
#include <algorithm>
#include <cmath>
#include <vector>

#include "block_sparse_attention/block_sparse_attention_kernels.h"

namespace baracuda {
namespace {

template <typename C>
void attend(const BlockSparseAttentionArgs& a) {
  const C* q = static_cast<const C*>(a.q);
  const C* k = static_cast<const C*>(a.k);
  const C* v = static_cast<const C*>(a.v);
  C* out = static_cast<C*>(a.out);
  C* lse = static_cast<C*>(a.lse);
  const int64_t group = a.heads / a.kv_heads;
  const C scale = static_cast<C>(a.scale);
  const C neg_inf = -static_cast<C>(INFINITY);
  std::vector<C> acc(a.v_dim), qrow(a.head_dim);
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      const int64_t g = h / group;
      const C* kbase = k + b * a.k_strides[0] + g * a.k_strides[1];
      const C* vbase = v + b * a.v_strides[0] + g * a.v_strides[1];
      for (int64_t i = 0; i < a.q_len; ++i) {
        const C* qi = q + b * a.q_strides[0] + h * a.q_strides[1] + i * a.q_strides[2];
        for (int64_t d = 0; d < a.head_dim; ++d) qrow[d] = qi[d * a.q_strides[3]] * scale;
        std::fill(acc.begin(), acc.end(), C(0));
        C m = neg_inf, l = 0;
        for_each_visible_key(a, b, h, i, [&](int64_t j) {
          const C* kj = kbase + j * a.k_strides[2];
          C s = 0;
          for (int64_t d = 0; d < a.head_dim; ++d) s += qrow[d] * kj[d * a.k_strides[3]];
          // Online softmax: rescale what was accumulated when the max grows.
          const C m_new = std::max(m, s);
          const C corr = std::exp(m - m_new);  // 0 on the first key (m = -inf)
          const C p = std::exp(s - m_new);
          l = l * corr + p;
          const C* vj = vbase + j * a.v_strides[2];
          for (int64_t e = 0; e < a.v_dim; ++e) {
            acc[e] = acc[e] * corr + p * vj[e * a.v_strides[3]];
          }
          m = m_new;
        });
        // Only a row that saw no key has l == 0 (the empty state); a NaN score
        // leaves l NaN, which then reaches both outputs.
        const bool empty = l == C(0);
        C* oi = out + b * a.out_strides[0] + h * a.out_strides[1] + i * a.out_strides[2];
        for (int64_t e = 0; e < a.v_dim; ++e) oi[e * a.out_strides[3]] = empty ? C(0) : acc[e] / l;
        lse[b * a.lse_strides[0] + h * a.lse_strides[1] + i * a.lse_strides[2]] =
            empty ? neg_inf : m + std::log(l);
      }
    }
  }
}

}  // namespace

KernelStatus block_sparse_attention_cpu(const BlockSparseAttentionArgs& a) {
  if (a.dtype == FloatDtype::kFloat32) { attend<float>(a); return KernelStatus::ok(); }
  if (a.dtype == FloatDtype::kFloat64) { attend<double>(a); return KernelStatus::ok(); }
  return KernelStatus::invalid("the host block-sparse attention takes float32 or float64");
}

}  // namespace baracuda
