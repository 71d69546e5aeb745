// Op layer of block-sparse attention's backward pass.
//
//   block_sparse_attention_backward(grad_out, grad_lse, q, k, v, out, lse, block_mask,
//                                   block_q, block_k, scale, is_causal)
//       -> (grad_q, grad_k, grad_v)
//
// The forward's arguments are validated as the forward validates them; the
// saved out and lse and the incoming gradients must have the forward's
// output shapes. A missing grad_out (only lse was used) counts as zeros, a
// missing grad_lse as no lse term.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <tuple>

#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "block_sparse_attention/block_sparse_attention_problem.h"
#include "common/torch_glue.h"

namespace baracuda {
namespace {

constexpr const char* kOp = "block_sparse_attention_backward";

void check_like(const char* name, const at::Tensor& t, at::IntArrayRef shape,
                at::ScalarType dtype, const at::Tensor& q) {
  TORCH_CHECK(t.layout() == at::kStrided, "baracuda::", kOp, ": ", name, " must be strided");
  TORCH_CHECK(t.sizes() == shape, "baracuda::", kOp, ": ", name, ".shape=", t.sizes(),
              " must be ", shape);
  TORCH_CHECK(t.scalar_type() == dtype, "baracuda::", kOp, ": ", name, ".dtype=",
              t.scalar_type(), " must be ", dtype);
  TORCH_CHECK(t.device() == q.device(), "baracuda::", kOp, ": ", name, " is on ", t.device(),
              " but q is on ", q.device());
}

// The operands the executor reads: half types in float32 on the host (its
// kernel takes float32 / float64), as they are on CUDA.
at::Tensor compute_operand(const at::Tensor& t) {
  const bool half = t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
  return t.is_cpu() && half ? t.to(at::kFloat) : t;
}

#ifdef BARACUDA_WITH_CUDA
// The wgmma backward takes the problems the Hopper forward takes, but for
// 256-wide heads; everything else runs the generic executor.
bool use_hopper_backward(const AttentionProblem& p) {
  return tensor_core_shape(p, /*hopper=*/true) && p.q.size(3) <= 128 &&
         !env_flag("BARACUDA_DISABLE_WGMMA") &&
         block_sparse_attention_hopper_available(p.q.get_device());
}
#endif

std::tuple<at::Tensor, at::Tensor, at::Tensor> block_sparse_attention_backward(
    const c10::optional<at::Tensor>& grad_out_in, const c10::optional<at::Tensor>& grad_lse_in,
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& lse_in, const at::Tensor& block_mask,
    int64_t block_q, int64_t block_k, c10::optional<double> scale, bool is_causal,
    c10::string_view causal_align,
    std::optional<c10::SymInt> window_left, std::optional<c10::SymInt> window_right,
    const std::optional<at::Tensor>& q_document_ids,
    const std::optional<at::Tensor>& kv_document_ids, const std::optional<at::Tensor>& partial_index,
    const std::optional<at::Tensor>& partial_bits, const std::optional<at::Tensor>& kv_lens) {
  const AttentionProblem p = validate_attention(kOp, q_in, k_in, v_in, block_mask, block_q,
                                                block_k, scale, is_causal,
                                                ElementArguments{causal_align, window_left, window_right, q_document_ids, kv_document_ids,
                                                 partial_index, partial_bits, kv_lens});
  const int64_t B = q_in.size(0), H = q_in.size(1), Lq = q_in.size(2), Dv = v_in.size(3);
  const at::ScalarType lse_dtype = attention_lse_dtype(q_in.scalar_type());
  check_like("out", out_in, {B, H, Lq, Dv}, q_in.scalar_type(), q_in);
  check_like("lse", lse_in, {B, H, Lq}, lse_dtype, q_in);
  const bool has_grad_out = grad_out_in.has_value() && grad_out_in->defined();
  const bool has_grad_lse = grad_lse_in.has_value() && grad_lse_in->defined();
  if (has_grad_out) check_like("grad_out", *grad_out_in, {B, H, Lq, Dv}, q_in.scalar_type(), q_in);
  if (has_grad_lse) check_like("grad_lse", *grad_lse_in, {B, H, Lq}, lse_dtype, q_in);

  at::Tensor grad_q = new_empty(q_in.sizes(), q_in.options());
  at::Tensor grad_k = new_empty(k_in.sizes(), k_in.options());
  at::Tensor grad_v = new_empty(v_in.sizes(), v_in.options());
  if (grad_q.numel() == 0 && grad_k.numel() == 0 && grad_v.numel() == 0) {
    return {grad_q, grad_k, grad_v};
  }
  const at::Tensor q = compute_operand(q_in), k = compute_operand(k_in), v = compute_operand(v_in);
  const at::Tensor out = compute_operand(out_in);
  const at::Tensor grad_out = compute_operand(has_grad_out ? *grad_out_in : at::zeros_like(out_in));
  // The host executor writes in its compute dtype; half gradients are cast after.
  const bool cast_after = !q.is_same(q_in);
  at::Tensor gq = cast_after ? new_empty(q.sizes(), q.options()) : grad_q;
  at::Tensor gk = cast_after ? new_empty(k.sizes(), k.options()) : grad_k;
  at::Tensor gv = cast_after ? new_empty(v.sizes(), v.options()) : grad_v;

  BlockSparseAttentionBackwardArgs a;
  a.forward = attention_args(p, q, k, v, at::Tensor(), at::Tensor());
  a.grad_out = grad_out.const_data_ptr();
  a.out = out.const_data_ptr();
  a.lse = lse_in.const_data_ptr();
  a.grad_lse = has_grad_lse ? grad_lse_in->const_data_ptr() : nullptr;
  a.grad_q = gq.data_ptr();
  a.grad_k = gk.data_ptr();
  a.grad_v = gv.data_ptr();
  strides_of(a.grad_out_strides, grad_out);
  strides_of(a.out_strides, out);
  strides_of(a.lse_strides, lse_in);
  if (has_grad_lse) strides_of(a.grad_lse_strides, *grad_lse_in);

  if (q.is_cpu()) {
    // Key head groups write disjoint gradients: any split over threads gives
    // the same bits.
    at::parallel_for(0, B * k_in.size(1), 1, [&](int64_t first, int64_t last) {
      check_status(block_sparse_attention_backward_cpu(a, first, last), kOp, "backward");
    });
  } else {
#ifdef BARACUDA_WITH_CUDA
    const c10::DeviceGuard guard(q_in.device());
    void* stream = current_cuda_stream(q_in);
    a.rows_stride = (Lq + 127) / 128 * 128;
    at::Tensor scratch = new_empty({2, B * H * a.rows_stride}, q_in.options().dtype(lse_dtype));
    a.delta = scratch[0].data_ptr();
    a.lse_log2 = scratch[1].data_ptr();
    check_status(block_sparse_attention_backward_rows_cuda(a, stream), kOp, "row scratch");
    if (use_hopper_backward(p)) {
      // The tensor copy engine's layout needs (a copy where they are missed),
      // and a work counter per kernel, zero at the start of every call.
      const at::Tensor qt = tensor_core_ready(q), kt = tensor_core_ready(k);
      const at::Tensor vt = tensor_core_ready(v), got = tensor_core_ready(grad_out);
      a.forward = attention_args(p, qt, kt, vt, at::Tensor(), at::Tensor());
      a.grad_out = got.const_data_ptr();
      strides_of(a.grad_out_strides, got);
      at::Tensor counters = at::zeros({2}, q_in.options().dtype(at::kInt));
      // One fused pass where it applies: a float32 dQ accumulator and the
      // order word of each 64-row query tile (see the Hopper backward).
      at::Tensor dq_accum, dq_order;
      if (block_sparse_attention_backward_hopper_fuses(a) &&
          !env_flag("BARACUDA_HOPPER_TWO_KERNEL_BACKWARD")) {
        dq_accum = new_empty({B * H * a.rows_stride * q.size(3)}, q_in.options().dtype(at::kFloat));
        dq_order = new_empty({B * H * a.rows_stride / 64}, q_in.options().dtype(at::kInt));
        a.dq_accum = dq_accum.data_ptr();
        a.dq_order = dq_order.data_ptr<int>();
      }
      check_status(block_sparse_attention_backward_hopper_cuda(a, counters.data_ptr<int>(), stream),
                   kOp, "backward");
    } else {
      check_status(block_sparse_attention_backward_generic_cuda(a, stream), kOp, "backward");
    }
#else
    TORCH_CHECK(false, "baracuda::", kOp, ": built without CUDA kernels; got ", q_in.device());
#endif
  }
  if (cast_after) {
    grad_q.copy_(gq);
    grad_k.copy_(gk);
    grad_v.copy_(gv);
  }
  return {grad_q, grad_k, grad_v};
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("block_sparse_attention_backward", &block_sparse_attention_backward);
}

#ifdef BARACUDA_WITH_CUDA
TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("block_sparse_attention_backward", &block_sparse_attention_backward);
}
#endif

}  // namespace baracuda
