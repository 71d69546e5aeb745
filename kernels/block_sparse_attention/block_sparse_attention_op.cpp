// Op layer of block-sparse attention: validation, mask layout, path choice.
//
//   block_sparse_attention(q, k, v, block_mask, block_q, block_k, scale, is_causal,
//                          causal_align, window_left, window_right,
//                          q_document_ids, kv_document_ids) -> (out, lse)
//   block_sparse_attention_path(...)  which executor the same call runs on
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "block_sparse_attention/block_sparse_attention_problem.h"
#include "block_sparse_attention/block_sparse_attention_tensor_core_plan.h"
#include "common/torch_glue.h"

namespace baracuda {
namespace {

constexpr const char* kOp = "block_sparse_attention";

struct Plan {
  AttentionPath path;
  at::Tensor q, k, v;  // the operands the executor reads (maybe copies)
};

Plan plan(const AttentionProblem& p) {
  if (p.q.is_cpu()) {
    const bool half = p.q.scalar_type() == at::kHalf || p.q.scalar_type() == at::kBFloat16;
    if (!half) return {AttentionPath::kHost, p.q, p.k, p.v};
    return {AttentionPath::kHost, p.q.to(at::kFloat), p.k.to(at::kFloat), p.v.to(at::kFloat)};
  }
  // The GPU is asked about only for problems some tensor-core kernel takes.
  if (tensor_core_shape(p, /*hopper=*/true)) {
#ifdef BARACUDA_WITH_CUDA
    // BARACUDA_DISABLE_WGMMA=1 keeps Hopper GPUs on the mma.sync kernel: to
    // compare the two, or to rule the newer one out when chasing a problem.
    const bool hopper = !env_flag("BARACUDA_DISABLE_WGMMA") &&
                        block_sparse_attention_hopper_available(p.q.get_device());
#else
    const bool hopper = false;
#endif
    if (hopper || tensor_core_shape(p, /*hopper=*/false)) {
      const AttentionPath path =
          hopper ? AttentionPath::kCudaHopper : AttentionPath::kCudaTensorCore;
      return {path, tensor_core_ready(p.q), tensor_core_ready(p.k), tensor_core_ready(p.v)};
    }
  }
  return {AttentionPath::kCudaGeneric, p.q, p.k, p.v};
}

const char* path_name(AttentionPath path) {
  switch (path) {
    case AttentionPath::kHost: return "cpu";
    case AttentionPath::kCudaGeneric: return "cuda_generic";
    case AttentionPath::kCudaTensorCore: return "cuda_tensor_core";
    case AttentionPath::kCudaHopper: return "cuda_wgmma";
  }
  return "unknown";
}

std::tuple<at::Tensor, at::Tensor> block_sparse_attention(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& block_mask, int64_t block_q, int64_t block_k, c10::optional<double> scale,
    bool is_causal, c10::string_view causal_align,
    std::optional<c10::SymInt> window_left, std::optional<c10::SymInt> window_right,
    const std::optional<at::Tensor>& q_document_ids,
    const std::optional<at::Tensor>& kv_document_ids, const std::optional<at::Tensor>& partial_index,
    const std::optional<at::Tensor>& partial_bits, const std::optional<at::Tensor>& kv_lens) {
  const AttentionProblem p = validate_attention(kOp, q_in, k_in, v_in, block_mask, block_q,
                                                block_k, scale, is_causal,
                                                ElementArguments{causal_align, window_left, window_right, q_document_ids, kv_document_ids,
                                                 partial_index, partial_bits, kv_lens});
  const int64_t B = q_in.size(0), H = q_in.size(1), Lq = q_in.size(2), Dv = v_in.size(3);
  at::Tensor out = new_empty({B, H, Lq, Dv}, q_in.options());
  at::Tensor lse = new_empty({B, H, Lq}, q_in.options().dtype(attention_lse_dtype(q_in.scalar_type())));
  if (out.numel() == 0) return {out, lse};
  const Plan pl = plan(p);
  // The host kernel writes in the compute dtype; half outputs are cast after.
  at::Tensor out_c = pl.q.scalar_type() == out.scalar_type() ? out : new_empty(out.sizes(), pl.q.options());
  const BlockSparseAttentionArgs a = attention_args(p, pl.q, pl.k, pl.v, out_c, lse);
  if (pl.path == AttentionPath::kHost) {
    check_status(block_sparse_attention_cpu(a), kOp, "attention");
  } else {
#ifdef BARACUDA_WITH_CUDA
    const c10::DeviceGuard guard(q_in.device());
    void* stream = current_cuda_stream(q_in);
    KernelStatus status = KernelStatus::ok();
    switch (pl.path) {
      case AttentionPath::kCudaHopper:
      case AttentionPath::kCudaTensorCore:
        status = run_tensor_core_forward(a, pl.path == AttentionPath::kCudaHopper, pl.q, out_c,
                                         lse, stream);
        break;
      default: status = block_sparse_attention_generic_cuda(a, stream); break;
    }
    check_status(status, kOp, "attention");
#else
    TORCH_CHECK(false, "baracuda::", kOp, ": built without CUDA kernels; got ", q_in.device());
#endif
  }
  if (!out_c.is_same(out)) out.copy_(out_c);
  return {out, lse};
}

std::string block_sparse_attention_path(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& block_mask,
                                        int64_t block_q, int64_t block_k,
                                        c10::optional<double> scale, bool is_causal,
                                        c10::string_view causal_align,
    std::optional<c10::SymInt> window_left, std::optional<c10::SymInt> window_right,
    const std::optional<at::Tensor>& q_document_ids,
    const std::optional<at::Tensor>& kv_document_ids, const std::optional<at::Tensor>& partial_index,
    const std::optional<at::Tensor>& partial_bits, const std::optional<at::Tensor>& kv_lens) {
  const AttentionProblem p = validate_attention(kOp, q, k, v, block_mask, block_q, block_k, scale,
                                                is_causal,
                                                ElementArguments{causal_align, window_left, window_right, q_document_ids, kv_document_ids,
                                                 partial_index, partial_bits, kv_lens});
  return path_name(plan(p).path);
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("block_sparse_attention", &block_sparse_attention);
  m.impl("block_sparse_attention_path", &block_sparse_attention_path);
}

#ifdef BARACUDA_WITH_CUDA
TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("block_sparse_attention", &block_sparse_attention);
  m.impl("block_sparse_attention_path", &block_sparse_attention_path);
}
#endif

}  // namespace baracuda
