// Launchers of the block-sparse attention family, over raw pointers.
//
//   out[b, h, i] = sum_j softmax_j(scale * <q[b, h, i], k[b, g, j]>) v[b, g, j]
//   lse[b, h, i] = log sum_j exp(scale * <q[b, h, i], k[b, g, j]>)   (natural log)
//
// over the keys j that are visible to query i: key block j / block_k is on in
// the mask row of query block i / block_q, and, with `causal`, j <= i (the
// top-left convention of torch's is_causal). g = h / (heads / kv_heads)
// (grouped-query attention). A row with no visible key gets out = 0 and
// lse = -inf, the empty attention state. Key blocks that are off are never
// read.
#pragma once

#include <cstdint>

#include "common/float_dtype.h"
#include "common/status.h"
#include "common/unit_types.h"

namespace baracuda {

struct BlockSparseAttentionArgs {
  FloatDtype dtype = FloatDtype::kFloat32;  // of q, k, v, out
  int64_t batch = 0, heads = 0, kv_heads = 0;
  int64_t q_len = 0, k_len = 0;
  int64_t head_dim = 0;  // of q and k
  int64_t v_dim = 0;     // of v and out
  int64_t block_q = 1, block_k = 1;            // mask granularity, in rows / keys
  int64_t num_q_blocks = 0, num_k_blocks = 0;  // ceil(q_len / block_q), ceil(k_len / block_k)
  double scale = 1.0;
  bool causal = false;
  const void* q = nullptr;  // [batch, heads, q_len, head_dim]
  const void* k = nullptr;  // [batch, kv_heads, k_len, head_dim]
  const void* v = nullptr;  // [batch, kv_heads, k_len, v_dim]
  void* out = nullptr;      // [batch, heads, q_len, v_dim]
  void* lse = nullptr;      // [batch, heads, q_len]: float32 (float64 with float64 inputs)
  // [mask_batch, mask_heads, num_q_blocks, num_k_blocks], nonzero byte = on;
  // a broadcast axis has stride 0.
  const uint8_t* mask = nullptr;
  // Strides in elements, axes in the order of the shapes above.
  int64_t q_strides[4] = {}, k_strides[4] = {}, v_strides[4] = {}, out_strides[4] = {};
  int64_t lse_strides[3] = {};
  int64_t mask_strides[4] = {};
};

// The backward pass of the same attention. With P = softmax of the visible
// scores (P_ij = exp(scale <q_i, k_j> - lse_i)):
//   dv_j = sum_i P_ij do_i
//   dS_ij = P_ij (<do_i, v_j> - delta_i),  delta_i = <do_i, out_i> - dlse_i
//   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i
// summed, for dk and dv, over the query heads that share a key head. A row
// that sees no key (lse = -inf) contributes nothing. `forward` holds q, k, v,
// the mask and the shapes exactly as the forward call had them (its out and
// lse pointers unused). On CUDA, block_sparse_attention_backward_rows_cuda
// fills the per-row scratch (delta, lse_log2) before an executor runs.
struct BlockSparseAttentionBackwardArgs {
  BlockSparseAttentionArgs forward;
  const void* grad_out = nullptr;   // [batch, heads, q_len, v_dim], q's dtype
  const void* out = nullptr;        // the forward's output, same layout
  const void* lse = nullptr;        // [batch, heads, q_len], the forward's (compute dtype)
  const void* grad_lse = nullptr;   // same layout as lse, or nullptr (no lse gradient)
  // Per-row scratch of the CUDA executors, [batch * heads, rows_stride] in
  // the compute dtype (rows_stride >= q_len, a multiple of 128, so that a
  // tile of rows never runs into the next head): delta, and lse in log2 units
  // with +inf for a row that saw no key (so that 2^(s - lse) is 0 there);
  // rows past q_len hold delta 0 and lse +inf.
  void* delta = nullptr;
  void* lse_log2 = nullptr;
  int64_t rows_stride = 0;
  void* grad_q = nullptr;           // contiguous [batch, heads, q_len, head_dim], q's dtype
  void* grad_k = nullptr;           // contiguous [batch, kv_heads, k_len, head_dim]
  void* grad_v = nullptr;           // contiguous [batch, kv_heads, k_len, v_dim]
  int64_t grad_out_strides[4] = {}, out_strides[4] = {};
  int64_t lse_strides[3] = {}, grad_lse_strides[3] = {};
};

// Which executor a call runs on.
enum class AttentionPath : int { kHost, kCudaGeneric, kCudaTensorCore, kCudaHopper };

// Rows of one CTA of the tensor-core kernel for this problem, 0 when that
// kernel cannot run it: float16/bfloat16, head_dim == v_dim in {64, 128},
// block_q a multiple of 64, block_k a multiple of 64 (the kernel's key tile),
// unit inner strides and 16-byte aligned rows of q, k, v and out.
inline int tensor_core_tile_rows(const BlockSparseAttentionArgs& a) {
  const bool half = a.dtype == FloatDtype::kFloat16 || a.dtype == FloatDtype::kBFloat16;
  if (!half || a.head_dim != a.v_dim || (a.head_dim != 64 && a.head_dim != 128)) return 0;
  if (a.block_k % 64 != 0 || a.block_q % 64 != 0) return 0;
  auto aligned = [](const void* p, const int64_t* s) {
    // 16 bytes = 8 half elements: every row start must be a multiple of it.
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && s[3] == 1 && s[0] % 8 == 0 &&
           s[1] % 8 == 0 && s[2] % 8 == 0;
  };
  if (!aligned(a.q, a.q_strides) || !aligned(a.k, a.k_strides) || !aligned(a.v, a.v_strides) ||
      !aligned(a.out, a.out_strides)) {
    return 0;
  }
  return a.block_q % 128 == 0 ? 128 : 64;
}

// Host executor for float32 / float64 (the op layer upcasts half types).
KernelStatus block_sparse_attention_cpu(const BlockSparseAttentionArgs& a);
// Any dtype, head dims up to 256, any block sizes and strides.
KernelStatus block_sparse_attention_generic_cuda(const BlockSparseAttentionArgs& a, void* stream);
// The mma.sync kernel; only for problems with tensor_core_tile_rows(a) > 0.
KernelStatus block_sparse_attention_tensor_core_cuda(const BlockSparseAttentionArgs& a,
                                                     void* stream);
// The wgmma + TMA kernel for the same problems, on Hopper GPUs. Its grid is
// persistent and hands out work through `work_counter`, one int32 in device
// memory that must be zero when the kernel starts.
KernelStatus block_sparse_attention_hopper_cuda(const BlockSparseAttentionArgs& a, int* work_counter,
                                               void* stream);
// Backward executors: the host one (float32 / float64, the op layer upcasts
// half types) and the generic CUDA one (any dtype, head dims up to 256, any
// block sizes and strides). Both are deterministic: every gradient element
// is written once, by one thread, summing in a fixed order. The host one
// runs the key head groups [first_group, last_group) of the
// batch * kv_heads groups (b, g), which write disjoint gradients.
KernelStatus block_sparse_attention_backward_cpu(const BlockSparseAttentionBackwardArgs& a,
                                                 int64_t first_group, int64_t last_group);
KernelStatus block_sparse_attention_backward_generic_cuda(const BlockSparseAttentionBackwardArgs& a,
                                                          void* stream);
// The wgmma + TMA backward on Hopper GPUs, for problems the Hopper forward
// takes (tensor_core_tile_rows > 0, grad_out laid out as the forward needs
// out) with rows_stride a multiple of 128. Two persistent kernels hand out
// work through work_counters[0] and [1], int32 in device memory that must be
// zero when the call starts.
KernelStatus block_sparse_attention_backward_hopper_cuda(const BlockSparseAttentionBackwardArgs& a,
                                                         int* work_counters, void* stream);
// Fills the per-row scratch (delta, lse_log2) the CUDA executors read.
KernelStatus block_sparse_attention_backward_rows_cuda(const BlockSparseAttentionBackwardArgs& a,
                                                       void* stream);
// Whether the Hopper kernel can run on `device`: built for sm_90a, a compute
// capability 9.x GPU, and a driver that encodes tensor maps.
bool block_sparse_attention_hopper_available(int device);

// ---------------------------------------------------------------- visibility
//
// Shared by every executor so they agree on which blocks are computed.

// One past the last key visible to any of the query rows [.., last_row]:
// with causal attention, keys beyond the last row are never visible.
BARACUDA_HOST_DEVICE inline int64_t visible_key_end(const BlockSparseAttentionArgs& a,
                                                    int64_t last_row) {
  if (!a.causal) return a.k_len;
  return last_row + 1 < a.k_len ? last_row + 1 : a.k_len;
}

// The mask row of query block qb of head h in batch b.
BARACUDA_HOST_DEVICE inline const uint8_t* mask_row(const BlockSparseAttentionArgs& a, int64_t b,
                                                    int64_t h, int64_t qb) {
  return a.mask + b * a.mask_strides[0] + h * a.mask_strides[1] + qb * a.mask_strides[2];
}

BARACUDA_HOST_DEVICE inline bool key_block_on(const BlockSparseAttentionArgs& a,
                                              const uint8_t* row, int64_t kb) {
  return row[kb * a.mask_strides[3]] != 0;
}

// Calls fn(j) for every key j visible to query row i of head h in batch b,
// in increasing order: the keys of its mask row's blocks that are on, up to
// the last visible key.
template <typename Fn>
BARACUDA_HOST_DEVICE inline void for_each_visible_key(const BlockSparseAttentionArgs& a, int64_t b,
                                                      int64_t h, int64_t i, Fn&& fn) {
  const uint8_t* row = mask_row(a, b, h, i / a.block_q);
  const int64_t key_end = visible_key_end(a, i);
  for (int64_t kb = 0; kb * a.block_k < key_end; ++kb) {
    if (!key_block_on(a, row, kb)) continue;
    const int64_t j_end = key_end < (kb + 1) * a.block_k ? key_end : (kb + 1) * a.block_k;
    for (int64_t j = kb * a.block_k; j < j_end; ++j) fn(j);
  }
}

}  // namespace baracuda
