// The validated form of a block-sparse attention call, shared by the
// forward and backward op layers: argument checks (with errors that name the
// op and the value), the mask as a 4-D view, and the launcher arguments.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <optional>

#include <cstdint>

#include "block_sparse_attention/block_sparse_attention_kernels.h"

namespace baracuda {

// The lse dtype for inputs of dtype t: float32, float64 for float64 inputs.
at::ScalarType attention_lse_dtype(at::ScalarType t);

// The element conditions of a call as the caller gives them (the schema's
// trailing arguments, shared by the forward, backward and path ops).
struct ElementArguments {
  c10::string_view causal_align = "top_left";
  std::optional<c10::SymInt> window_left, window_right;
  std::optional<at::Tensor> q_document_ids, kv_document_ids;
  std::optional<at::Tensor> partial_index, partial_bits;
  std::optional<at::Tensor> kv_lens;
};

// A validated call: the inputs, the mask as a 4-D view, and the element
// conditions in the executors' terms (BlockSparseAttentionArgs).
struct AttentionProblem {
  at::Tensor q, k, v, mask;
  int64_t block_q, block_k, num_q_blocks, num_k_blocks;
  double scale;
  bool causal;
  bool bottom_right = false;
  int64_t window_left = kUnboundedWindow, window_right = kUnboundedWindow;
  at::Tensor q_documents, kv_documents;  // int64, contiguous rows; undefined without ids
  at::Tensor partial_index, partial_bits;  // an exact mask's; undefined without
  at::Tensor kv_lens;                      // int32 or int64 [batch]; undefined without
};

// Checks a call's arguments; `op` names the op in error messages.
AttentionProblem validate_attention(const char* op, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, const at::Tensor& block_mask,
                                    int64_t block_q, int64_t block_k, c10::optional<double> scale,
                                    bool causal, const ElementArguments& element);

// Strides in elements, a size-1 axis as 0: that is how a broadcast mask axis
// is read, and it keeps alignment tests independent of the (meaningless)
// stride of an axis of one element.
template <size_t N>
void strides_of(int64_t (&out)[N], const at::Tensor& t) {
  for (size_t d = 0; d < N; ++d) out[d] = t.size(d) == 1 ? 0 : t.stride(d);
}

// Launcher arguments for operands q, k, v (the problem's, or copies of
// them) and outputs out, lse (either may be undefined).
BlockSparseAttentionArgs attention_args(const AttentionProblem& p, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& out, const at::Tensor& lse);

// The tensor-core kernels want unit inner strides and 16-byte aligned rows,
// and distinct rows (the tensor copy engine cannot repeat one along the
// sequence; repeated batches or heads are fine); a tensor that misses only
// that is copied once into a fresh contiguous buffer.
at::Tensor tensor_core_ready(const at::Tensor& t);

// Whether the problem fits the tensor-core forward kernels apart from their
// layout needs: float16 / bfloat16, head_dim == v_dim in {64, 128}, blocks
// that are multiples of 64; position conditions and exact-mask bits are
// fine. On the Hopper kernels (`hopper`) also document ids and head_dim 256
// (the forward; the backward of 256-wide heads runs the generic kernel).
bool tensor_core_shape(const AttentionProblem& p, bool hopper);

// Whether environment variable `name` is set to anything but "" or "0".
bool env_flag(const char* name);

}  // namespace baracuda
