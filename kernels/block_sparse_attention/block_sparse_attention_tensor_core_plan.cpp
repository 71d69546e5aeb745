#include "block_sparse_attention/block_sparse_attention_tensor_core_plan.h"

#ifdef BARACUDA_WITH_CUDA

#include <ATen/ops/zeros.h>

#include <cmath>
#include <cstdint>

#include "common/torch_glue.h"
#include "merge/merge_kernels.h"

namespace baracuda {
namespace {

// A tile holds 64 rows at least: heads with fewer queries than that waste
// most of it unless the heads of a group share one.
constexpr int64_t kPackBelowQueries = 64;

int64_t axis_stride(int64_t size, int64_t stride) { return size == 1 ? 0 : stride; }

// Whether the rows of t [B, H, L, ...] of the `group` heads of a key head
// follow each other at one stride, so that they read as one head of
// group * L rows.
bool rows_pack(const at::Tensor& t) { return t.size(2) == 1 || t.stride(1) == t.size(2) * t.stride(2); }

// Strides [batch, head, row] of t [B, H, L, ...] seen as [B, H / group,
// group * L, ...].
void packed_strides(int64_t* out, const at::Tensor& t, int64_t group) {
  const int64_t packed_heads = t.size(1) / group;
  out[0] = axis_stride(t.size(0), t.stride(0));
  out[1] = axis_stride(packed_heads, group * t.stride(1));
  out[2] = t.size(2) == 1 ? t.stride(1) : t.stride(2);
}

// Packing needs one mask row for every head of a group and every query: a
// mask broadcast over heads, with one query block (or broadcast over them),
// and no masks tested per element (exact-mask bits, document ids: their
// rows are queries, not packed rows).
bool can_pack(const BlockSparseAttentionArgs& a, const at::Tensor& q, const at::Tensor& out) {
  const int64_t group = a.heads / a.kv_heads;
  return group > 1 && a.q_len < kPackBelowQueries && element_tests(a) == kTestsNone &&
         a.mask_strides[1] == 0 &&
         (a.num_q_blocks == 1 || a.mask_strides[2] == 0) && rows_pack(q) && rows_pack(out);
}

// Where out and lse go: `o` [B, H, Lq, Dv] and `l` [B, H, Lq] (one split's
// part of the partial states, or the op's outputs), packed as q is.
void point_outputs(BlockSparseAttentionArgs& a, const at::Tensor& o, const at::Tensor& l,
                   int64_t group) {
  a.out = o.data_ptr();
  a.lse = l.data_ptr();
  if (group > 1) {
    packed_strides(a.out_strides, o, group);
    a.out_strides[3] = 1;
    packed_strides(a.lse_strides, l, group);
  } else {
    for (int d = 0; d < 4; ++d) a.out_strides[d] = axis_stride(o.size(d), o.stride(d));
    for (int d = 0; d < 3; ++d) a.lse_strides[d] = axis_stride(l.size(d), l.stride(d));
  }
}

KernelStatus launch(const BlockSparseAttentionArgs& a, bool hopper, const at::Tensor& q,
                    void* stream) {
  if (!hopper) return block_sparse_attention_tensor_core_cuda(a, stream);
  // The persistent kernel's work counter starts at zero on every call.
  at::Tensor counter = at::zeros({1}, q.options().dtype(at::kInt));
  return block_sparse_attention_hopper_cuda(a, counter.data_ptr<int>(), stream);
}

// (partial out, partial lse) of every split, stacked on the first axis ->
// (merged, lse): the merge family's stack form over cells of Dv values.
KernelStatus merge_splits(const at::Tensor& parts, const at::Tensor& part_lse,
                          const at::Tensor& merged, const at::Tensor& lse, void* stream) {
  MergeForwardArgs m;
  m.dtype = FloatDtype::kFloat32;
  m.stacked = true;
  m.num_states = parts.size(0);
  m.head_dim = parts.size(-1);
  m.v[0] = parts.const_data_ptr();
  m.s[0] = part_lse.const_data_ptr();
  m.v_state_stride = parts.stride(0);
  m.s_state_stride = part_lse.stride(0);
  m.v_out = merged.data_ptr();
  m.s_out = lse.data_ptr();
  m.cells.rank = 1;
  m.cells.sizes[0] = lse.numel();
  m.cell_strides[kFwV0][0] = m.head_dim;
  m.cell_strides[kFwS0][0] = 1;
  m.cell_strides[kFwVOut][0] = m.head_dim;
  m.cell_strides[kFwSOut][0] = 1;
  m.inner_strides[kFwV0] = 1;
  m.inner_strides[kFwVOut] = 1;
  m.log2_scale = 1.0 / std::log(2.0);  // the attention's lse is natural
  return merge_forward_cuda(m, stream);
}

}  // namespace

KernelStatus run_tensor_core_forward(BlockSparseAttentionArgs a, bool hopper, const at::Tensor& q,
                                     const at::Tensor& out, const at::Tensor& lse, void* stream) {
  const int64_t B = a.batch, H = a.heads, Lq = a.q_len, Dv = a.v_dim;
  int64_t group = 1;
  if (can_pack(a, q, out)) {
    group = a.heads / a.kv_heads;
    packed_strides(a.q_strides, q, group);
    a.q_period = Lq;
    a.q_len = group * Lq;
    a.heads = a.kv_heads;
    a.block_q = a.q_len <= 64 ? 64 : 128;
    a.num_q_blocks = (a.q_len + a.block_q - 1) / a.block_q;
    a.mask_strides[2] = 0;  // every packed row reads the mask row of query block 0
  }
  a.kv_splits = tensor_core_key_splits(a);
  if (a.kv_splits == 1) {
    point_outputs(a, out, lse, group);
    return launch(a, hopper, q, stream);
  }
  a.split_keys = (a.k_len + a.kv_splits - 1) / a.kv_splits;
  a.split_keys = (a.split_keys + 127) / 128 * 128;  // whole key tiles of either kernel
  a.kv_splits = (a.k_len + a.split_keys - 1) / a.split_keys;
  const auto f32 = q.options().dtype(at::kFloat);
  const at::Tensor parts = new_empty({a.kv_splits, B, H, Lq, Dv}, f32);
  const at::Tensor part_lse = new_empty({a.kv_splits, B, H, Lq}, f32);
  point_outputs(a, parts[0], part_lse[0], group);
  a.out_split_stride = parts.stride(0);
  a.lse_split_stride = part_lse.stride(0);
  KernelStatus status = launch(a, hopper, q, stream);
  if (!status.is_ok()) return status;
  const at::Tensor merged = new_empty({B, H, Lq, Dv}, f32);
  status = merge_splits(parts, part_lse, merged, lse, stream);
  if (status.is_ok()) out.copy_(merged);
  return status;
}

}  // namespace baracuda

#endif  // BARACUDA_WITH_CUDA
