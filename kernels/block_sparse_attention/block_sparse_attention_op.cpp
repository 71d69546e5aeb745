// Op layer of block-sparse attention: validation, mask layout, path choice.
//
//   block_sparse_attention(q, k, v, block_mask, block_q, block_k, scale, is_causal)
//       -> (out, lse)
//   block_sparse_attention_path(...)  which executor the same call runs on
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>

#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "common/torch_glue.h"

namespace baracuda {
namespace {

constexpr const char* kOp = "block_sparse_attention";
constexpr int64_t kMaxHeadDim = 256;

at::ScalarType lse_dtype_for(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// A validated call: the inputs, and the mask as a 4-D view.
struct Problem {
  at::Tensor q, k, v, mask;
  int64_t block_q, block_k, num_q_blocks, num_k_blocks;
  double scale;
  bool causal;
};

void check_input(const char* name, const at::Tensor& t, const at::Tensor& q) {
  TORCH_CHECK(t.layout() == at::kStrided, "baracuda::", kOp, ": ", name, " must be a strided tensor");
  TORCH_CHECK(t.dim() == 4, "baracuda::", kOp, ": ", name, ".dim()=", t.dim(),
              " must be 4 ([batch, heads, length, head_dim])");
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "baracuda::", kOp, ": ", name, ".dtype=",
              t.scalar_type(), " must equal q.dtype=", q.scalar_type());
  TORCH_CHECK(t.device() == q.device(), "baracuda::", kOp, ": ", name, " is on ", t.device(),
              " but q is on ", q.device());
}

// The mask as [mask_batch, mask_heads, num_q_blocks, num_k_blocks]; the
// flattened [.., .., num_q_blocks * num_k_blocks] layout is reshaped.
at::Tensor mask_as_4d(const at::Tensor& mask, int64_t nbq, int64_t nbk) {
  TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == at::kByte, "baracuda::",
              kOp, ": block_mask.dtype=", mask.scalar_type(), " must be bool or uint8");
  TORCH_CHECK(mask.layout() == at::kStrided, "baracuda::", kOp, ": block_mask must be strided");
  if (mask.dim() == 3) {
    TORCH_CHECK(mask.size(2) == nbq * nbk, "baracuda::", kOp, ": block_mask.shape=", mask.sizes(),
                " is flattened but its last axis is not num_q_blocks * num_k_blocks = ", nbq,
                " * ", nbk, " = ", nbq * nbk);
    return mask.reshape({mask.size(0), mask.size(1), nbq, nbk});
  }
  TORCH_CHECK(mask.dim() == 4, "baracuda::", kOp, ": block_mask.dim()=", mask.dim(),
              " must be 4 ([batch or 1, heads or 1, num_q_blocks, num_k_blocks]) or 3 (flattened)");
  return mask;
}

Problem validate(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& block_mask, int64_t block_q, int64_t block_k,
                 c10::optional<double> scale, bool causal) {
  check_input("q", q, q);
  check_input("k", k, q);
  check_input("v", v, q);
  float_dtype_of(kOp, "q", q);
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), D = q.size(3);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B, "baracuda::", kOp, ": batch sizes differ: q ",
              B, ", k ", k.size(0), ", v ", v.size(0));
  TORCH_CHECK(k.size(1) == v.size(1), "baracuda::", kOp, ": k has ", k.size(1),
              " heads but v has ", v.size(1));
  const int64_t Hkv = k.size(1);
  TORCH_CHECK(Hkv > 0 ? H % Hkv == 0 : H == 0, "baracuda::", kOp, ": q has ", H,
              " heads, not a multiple of the ", Hkv, " heads of k and v");
  TORCH_CHECK(k.size(3) == D, "baracuda::", kOp, ": k.shape[-1]=", k.size(3),
              " must equal q.shape[-1]=", D);
  TORCH_CHECK(v.size(2) == k.size(2), "baracuda::", kOp, ": v.shape[2]=", v.size(2),
              " must equal k.shape[2]=", k.size(2), " (one value per key)");
  TORCH_CHECK(D >= 1 && D <= kMaxHeadDim, "baracuda::", kOp, ": head_dim=", D,
              " must be in [1, ", kMaxHeadDim, "]");
  TORCH_CHECK(v.size(3) >= 1 && v.size(3) <= kMaxHeadDim, "baracuda::", kOp, ": v.shape[-1]=",
              v.size(3), " must be in [1, ", kMaxHeadDim, "]");
  TORCH_CHECK(block_q > 0 && block_k > 0, "baracuda::", kOp, ": block_size=(", block_q, ", ",
              block_k, ") must be positive");
  TORCH_CHECK(!scale.has_value() || std::isfinite(*scale), "baracuda::", kOp, ": scale=",
              scale.value_or(0.0), " must be finite");
  TORCH_CHECK(block_mask.device() == q.device(), "baracuda::", kOp, ": block_mask is on ",
              block_mask.device(), " but q is on ", q.device());
  const int64_t nbq = (Lq + block_q - 1) / block_q, nbk = (k.size(2) + block_k - 1) / block_k;
  at::Tensor mask = mask_as_4d(block_mask, nbq, nbk);
  const bool batch_ok = mask.size(0) == B || mask.size(0) == 1;
  const bool heads_ok = mask.size(1) == H || mask.size(1) == 1;
  TORCH_CHECK(batch_ok && heads_ok && mask.size(2) == nbq && mask.size(3) == nbk, "baracuda::",
              kOp, ": block_mask.shape=", mask.sizes(), " must be [", B, " or 1, ", H, " or 1, ",
              nbq, ", ", nbk, "] (ceil(", Lq, " / ", block_q, ") query blocks, ceil(", k.size(2),
              " / ", block_k, ") key blocks)");
  return {q, k, v, mask, block_q, block_k, nbq, nbk,
          scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(D)), causal};
}

template <size_t N>
void strides_of(int64_t (&out)[N], const at::Tensor& t) {
  for (size_t d = 0; d < N; ++d) out[d] = t.size(d) == 1 ? 0 : t.stride(d);
}

BlockSparseAttentionArgs make_args(const Problem& p, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& out,
                                   const at::Tensor& lse) {
  BlockSparseAttentionArgs a;
  a.dtype = float_dtype_of(kOp, "q", q);
  a.batch = q.size(0);
  a.heads = q.size(1);
  a.kv_heads = k.size(1);
  a.q_len = q.size(2);
  a.k_len = k.size(2);
  a.head_dim = q.size(3);
  a.v_dim = v.size(3);
  a.block_q = p.block_q;
  a.block_k = p.block_k;
  a.num_q_blocks = p.num_q_blocks;
  a.num_k_blocks = p.num_k_blocks;
  a.scale = p.scale;
  a.causal = p.causal;
  a.q = q.const_data_ptr();
  a.k = k.const_data_ptr();
  a.v = v.const_data_ptr();
  a.out = out.defined() ? out.data_ptr() : nullptr;
  a.lse = lse.defined() ? lse.data_ptr() : nullptr;
  a.mask = static_cast<const uint8_t*>(p.mask.const_data_ptr());
  // Size-1 axes get stride 0: that is how a broadcast mask axis is read, and
  // it keeps the alignment test of the tensor-core path independent of the
  // (meaningless) stride of an axis of one element.
  strides_of(a.q_strides, q);
  strides_of(a.k_strides, k);
  strides_of(a.v_strides, v);
  strides_of(a.out_strides, out.defined() ? out : q);
  strides_of(a.mask_strides, p.mask);
  if (lse.defined()) strides_of(a.lse_strides, lse);
  return a;
}

// The tensor-core kernels want unit inner strides and 16-byte aligned rows,
// and distinct rows (the tensor copy engine cannot repeat one along the
// sequence; repeated batches or heads are fine); a tensor that misses only
// that is copied once into a fresh contiguous buffer.
at::Tensor tensor_core_ready(const at::Tensor& t) {
  const bool ok = t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0 &&
                  (t.size(0) == 1 || t.stride(0) % 8 == 0) &&
                  (t.size(1) == 1 || t.stride(1) % 8 == 0) &&
                  (t.size(2) == 1 || (t.stride(2) % 8 == 0 && t.stride(2) != 0));
  return ok ? t : t.clone(at::MemoryFormat::Contiguous);
}

// Whether the problem fits the tensor-core kernel apart from its layout needs.
bool tensor_core_shape(const Problem& p) {
  const auto s = p.q.scalar_type();
  const int64_t D = p.q.size(3);
  return (s == at::kHalf || s == at::kBFloat16) && p.v.size(3) == D && (D == 64 || D == 128) &&
         p.block_q % 64 == 0 && p.block_k % 64 == 0;
}

// BARACUDA_DISABLE_WGMMA=1 keeps Hopper GPUs on the mma.sync kernel: to
// compare the two, or to rule the newer one out when chasing a problem.
bool wgmma_disabled() {
  const char* value = std::getenv("BARACUDA_DISABLE_WGMMA");
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

struct Plan {
  AttentionPath path;
  at::Tensor q, k, v;  // the operands the executor reads (maybe copies)
};

Plan plan(const Problem& p) {
  if (p.q.is_cpu()) {
    const bool half = p.q.scalar_type() == at::kHalf || p.q.scalar_type() == at::kBFloat16;
    if (!half) return {AttentionPath::kHost, p.q, p.k, p.v};
    return {AttentionPath::kHost, p.q.to(at::kFloat), p.k.to(at::kFloat), p.v.to(at::kFloat)};
  }
  if (tensor_core_shape(p)) {
#ifdef BARACUDA_WITH_CUDA
    const AttentionPath path =
        !wgmma_disabled() && block_sparse_attention_hopper_available(p.q.get_device())
            ? AttentionPath::kCudaHopper
            : AttentionPath::kCudaTensorCore;
#else
    const AttentionPath path = AttentionPath::kCudaTensorCore;
#endif
    return {path, tensor_core_ready(p.q), tensor_core_ready(p.k), tensor_core_ready(p.v)};
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
    bool is_causal) {
  const Problem p = validate(q_in, k_in, v_in, block_mask, block_q, block_k, scale, is_causal);
  const int64_t B = q_in.size(0), H = q_in.size(1), Lq = q_in.size(2), Dv = v_in.size(3);
  at::Tensor out = at::empty({B, H, Lq, Dv}, q_in.options());
  at::Tensor lse = at::empty({B, H, Lq}, q_in.options().dtype(lse_dtype_for(q_in.scalar_type())));
  if (out.numel() == 0) return {out, lse};
  const Plan pl = plan(p);
  // The host kernel writes in the compute dtype; half outputs are cast after.
  at::Tensor out_c = pl.q.scalar_type() == out.scalar_type() ? out : at::empty(out.sizes(), pl.q.options());
  const BlockSparseAttentionArgs a = make_args(p, pl.q, pl.k, pl.v, out_c, lse);
  if (pl.path == AttentionPath::kHost) {
    check_status(block_sparse_attention_cpu(a), kOp, "attention");
  } else {
#ifdef BARACUDA_WITH_CUDA
    const c10::DeviceGuard guard(q_in.device());
    void* stream = current_cuda_stream(q_in);
    KernelStatus status = KernelStatus::ok();
    switch (pl.path) {
      case AttentionPath::kCudaHopper: {
        // The persistent kernel's work counter starts at zero on every call.
        at::Tensor counter = at::zeros({1}, q_in.options().dtype(at::kInt));
        status = block_sparse_attention_hopper_cuda(a, counter.data_ptr<int>(), stream);
        break;
      }
      case AttentionPath::kCudaTensorCore:
        status = block_sparse_attention_tensor_core_cuda(a, stream);
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
                                        c10::optional<double> scale, bool is_causal) {
  return path_name(plan(validate(q, k, v, block_mask, block_q, block_k, scale, is_causal)).path);
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
