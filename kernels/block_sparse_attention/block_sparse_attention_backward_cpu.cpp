// Host executor of block-sparse attention's backward pass (float32 /
// float64), the reference the CUDA executors are tested against. Each key
// head group (b, g) is one unit of work: it owns dk and dv of its keys and
// dq of the query heads that share it, so units never write the same
// element and the op layer may run them on any number of threads with the
// same bits. Within a unit, rows and keys are visited in the forward's order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "block_sparse_attention/block_sparse_attention_kernels.h"

namespace baracuda {
namespace {

template <typename C>
void backward_groups(const BlockSparseAttentionBackwardArgs& ba, int64_t first, int64_t last) {
  const BlockSparseAttentionArgs& a = ba.forward;
  const C* q = static_cast<const C*>(a.q);
  const C* k = static_cast<const C*>(a.k);
  const C* v = static_cast<const C*>(a.v);
  const C* dout = static_cast<const C*>(ba.grad_out);
  const C* out = static_cast<const C*>(ba.out);
  const C* lse = static_cast<const C*>(ba.lse);
  const C* dlse = static_cast<const C*>(ba.grad_lse);
  const int64_t group = a.heads / a.kv_heads;
  const C scale = static_cast<C>(a.scale);
  std::vector<C> dq_row(a.head_dim);
  for (int64_t unit = first; unit < last; ++unit) {
    const int64_t b = unit / a.kv_heads, g = unit % a.kv_heads;
    C* dk = static_cast<C*>(ba.grad_k) + unit * a.k_len * a.head_dim;
    C* dv = static_cast<C*>(ba.grad_v) + unit * a.k_len * a.v_dim;
    std::fill(dk, dk + a.k_len * a.head_dim, C(0));
    std::fill(dv, dv + a.k_len * a.v_dim, C(0));
    const C* kbase = k + b * a.k_strides[0] + g * a.k_strides[1];
    const C* vbase = v + b * a.v_strides[0] + g * a.v_strides[1];
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = 0; i < a.q_len; ++i) {
        const C* qi = q + b * a.q_strides[0] + h * a.q_strides[1] + i * a.q_strides[2];
        const int64_t* go = ba.grad_out_strides;
        const C* doi = dout + b * go[0] + h * go[1] + i * go[2];
        const C* oi = out + b * ba.out_strides[0] + h * ba.out_strides[1] + i * ba.out_strides[2];
        const C lse_i = lse[b * ba.lse_strides[0] + h * ba.lse_strides[1] + i * ba.lse_strides[2]];
        C* dqi = static_cast<C*>(ba.grad_q) + ((b * a.heads + h) * a.q_len + i) * a.head_dim;
        std::fill(dq_row.begin(), dq_row.end(), C(0));
        // A row that saw no key has no gradient (and nothing to visit below).
        if (lse_i != -static_cast<C>(INFINITY)) {
          C delta = 0;
          for (int64_t e = 0; e < a.v_dim; ++e) {
            delta += doi[e * go[3]] * oi[e * ba.out_strides[3]];
          }
          if (dlse != nullptr) {
            delta -= dlse[b * ba.grad_lse_strides[0] + h * ba.grad_lse_strides[1] +
                          i * ba.grad_lse_strides[2]];
          }
          for_each_visible_key(a, b, h, i, [&](int64_t j) {
            const C* kj = kbase + j * a.k_strides[2];
            const C* vj = vbase + j * a.v_strides[2];
            C s = 0, dp = 0;
            for (int64_t d = 0; d < a.head_dim; ++d) {
              s += qi[d * a.q_strides[3]] * kj[d * a.k_strides[3]];
            }
            for (int64_t e = 0; e < a.v_dim; ++e) dp += doi[e * go[3]] * vj[e * a.v_strides[3]];
            const C p = std::exp(s * scale - lse_i);
            const C ds = p * (dp - delta);
            for (int64_t d = 0; d < a.head_dim; ++d) {
              dq_row[d] += ds * kj[d * a.k_strides[3]];
              dk[j * a.head_dim + d] += ds * qi[d * a.q_strides[3]];
            }
            for (int64_t e = 0; e < a.v_dim; ++e) dv[j * a.v_dim + e] += p * doi[e * go[3]];
          });
        }
        for (int64_t d = 0; d < a.head_dim; ++d) dqi[d] = dq_row[d] * scale;
      }
    }
    for (int64_t x = 0; x < a.k_len * a.head_dim; ++x) dk[x] *= scale;
  }
}

}  // namespace

KernelStatus block_sparse_attention_backward_cpu(const BlockSparseAttentionBackwardArgs& a,
                                                 int64_t first_group, int64_t last_group) {
  if (a.forward.dtype == FloatDtype::kFloat32) {
    backward_groups<float>(a, first_group, last_group);
    return KernelStatus::ok();
  }
  if (a.forward.dtype == FloatDtype::kFloat64) {
    backward_groups<double>(a, first_group, last_group);
    return KernelStatus::ok();
  }
  return KernelStatus::invalid("the host block-sparse attention backward takes float32 or float64");
}

}  // namespace baracuda
