// Validation and launcher arguments shared by block-sparse attention's
// forward and backward op layers.
#include "block_sparse_attention/block_sparse_attention_problem.h"

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "common/torch_glue.h"

namespace baracuda {
namespace {

constexpr int64_t kMaxHeadDim = 256;

void check_input(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q) {
  TORCH_CHECK(t.layout() == at::kStrided, "baracuda::", op, ": ", name, " must be a strided tensor");
  TORCH_CHECK(t.dim() == 4, "baracuda::", op, ": ", name, ".dim()=", t.dim(),
              " must be 4 ([batch, heads, length, head_dim])");
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "baracuda::", op, ": ", name, ".dtype=",
              t.scalar_type(), " must equal q.dtype=", q.scalar_type());
  TORCH_CHECK(t.device() == q.device(), "baracuda::", op, ": ", name, " is on ", t.device(),
              " but q is on ", q.device());
}

// The mask as [mask_batch, mask_heads, num_q_blocks, num_k_blocks]; the
// flattened [.., .., num_q_blocks * num_k_blocks] layout is reshaped.
at::Tensor mask_as_4d(const char* op, const at::Tensor& mask, int64_t nbq, int64_t nbk) {
  TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == at::kByte, "baracuda::",
              op, ": block_mask.dtype=", mask.scalar_type(), " must be bool or uint8");
  TORCH_CHECK(mask.layout() == at::kStrided, "baracuda::", op, ": block_mask must be strided");
  if (mask.dim() == 3) {
    TORCH_CHECK(mask.size(2) == nbq * nbk, "baracuda::", op, ": block_mask.shape=", mask.sizes(),
                " is flattened but its last axis is not num_q_blocks * num_k_blocks = ", nbq,
                " * ", nbk, " = ", nbq * nbk);
    return mask.reshape({mask.size(0), mask.size(1), nbq, nbk});
  }
  TORCH_CHECK(mask.dim() == 4, "baracuda::", op, ": block_mask.dim()=", mask.dim(),
              " must be 4 ([batch or 1, heads or 1, num_q_blocks, num_k_blocks]) or 3 (flattened)");
  return mask;
}

// A window side: None (no limit) or a non-negative number of keys.
int64_t window_side(const char* op, const char* name, const std::optional<c10::SymInt>& side) {
  if (!side.has_value()) return kUnboundedWindow;
  const int64_t n = side->expect_int();
  TORCH_CHECK(n >= 0, "baracuda::", op, ": ", name, "=", n,
              " must be non-negative (None for no limit on that side)");
  return n < kUnboundedWindow ? n : kUnboundedWindow;
}

// Document ids of the rows (or keys): integer [batch or 1, length] on q's
// device, as int64 with contiguous rows.
at::Tensor document_ids(const char* op, const char* name, const at::Tensor& ids, int64_t batch,
                        int64_t length, const at::Tensor& q) {
  TORCH_CHECK(ids.layout() == at::kStrided, "baracuda::", op, ": ", name, " must be strided");
  TORCH_CHECK(ids.scalar_type() == at::kInt || ids.scalar_type() == at::kLong, "baracuda::", op,
              ": ", name, ".dtype=", ids.scalar_type(), " must be int32 or int64");
  TORCH_CHECK(ids.device() == q.device(), "baracuda::", op, ": ", name, " is on ", ids.device(),
              " but q is on ", q.device());
  TORCH_CHECK(ids.dim() == 2 && (ids.size(0) == batch || ids.size(0) == 1) &&
                  ids.size(1) == length,
              "baracuda::", op, ": ", name, ".shape=", ids.sizes(), " must be [", batch,
              " or 1, ", length, "]");
  return ids.to(at::kLong).contiguous();
}

// An exact mask's partial tiles: partial_index int32 shaped as the 4-D
// mask, partial_bits int32 [slots, block_q, ceil(block_k / 32)], on q's
// device. Sets p.partial_index and p.partial_bits.
void partial_tiles(const char* op, const at::Tensor& index, const at::Tensor& bits,
                   AttentionProblem& p) {
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"partial_index", index},
                                {"partial_bits", bits}}) {
    TORCH_CHECK(t.layout() == at::kStrided && t.scalar_type() == at::kInt, "baracuda::", op, ": ",
                name, " must be a strided int32 tensor, got ", t.scalar_type());
    TORCH_CHECK(t.device() == p.q.device(), "baracuda::", op, ": ", name, " is on ", t.device(),
                " but q is on ", p.q.device());
  }
  TORCH_CHECK(index.sizes() == p.mask.sizes(), "baracuda::", op, ": partial_index.shape=",
              index.sizes(), " must equal the block mask's ", p.mask.sizes(),
              " (an exact mask built for other lengths or block sizes?)");
  const int64_t words = (p.block_k + 31) / 32;
  TORCH_CHECK(bits.dim() == 3 && bits.size(1) == p.block_q && bits.size(2) == words,
              "baracuda::", op, ": partial_bits.shape=", bits.sizes(), " must be [slots, ",
              p.block_q, ", ", words, "] for block_size=(", p.block_q, ", ", p.block_k,
              ") (an exact mask built for other block sizes?)");
  p.partial_index = index;
  p.partial_bits = bits.contiguous();
}

}  // namespace

AttentionProblem validate_attention(const char* op, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, const at::Tensor& block_mask,
                                    int64_t block_q, int64_t block_k, c10::optional<double> scale,
                                    bool causal, const ElementArguments& element) {
  check_input(op, "q", q, q);
  check_input(op, "k", k, q);
  check_input(op, "v", v, q);
  float_dtype_of(op, "q", q);
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), D = q.size(3);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B, "baracuda::", op, ": batch sizes differ: q ",
              B, ", k ", k.size(0), ", v ", v.size(0));
  TORCH_CHECK(k.size(1) == v.size(1), "baracuda::", op, ": k has ", k.size(1),
              " heads but v has ", v.size(1));
  const int64_t Hkv = k.size(1);
  TORCH_CHECK(Hkv > 0 ? H % Hkv == 0 : H == 0, "baracuda::", op, ": q has ", H,
              " heads, not a multiple of the ", Hkv, " heads of k and v");
  TORCH_CHECK(k.size(3) == D, "baracuda::", op, ": k.shape[-1]=", k.size(3),
              " must equal q.shape[-1]=", D);
  TORCH_CHECK(v.size(2) == k.size(2), "baracuda::", op, ": v.shape[2]=", v.size(2),
              " must equal k.shape[2]=", k.size(2), " (one value per key)");
  TORCH_CHECK(D >= 1 && D <= kMaxHeadDim, "baracuda::", op, ": head_dim=", D,
              " must be in [1, ", kMaxHeadDim, "]");
  TORCH_CHECK(v.size(3) >= 1 && v.size(3) <= kMaxHeadDim, "baracuda::", op, ": v.shape[-1]=",
              v.size(3), " must be in [1, ", kMaxHeadDim, "]");
  TORCH_CHECK(block_q > 0 && block_k > 0, "baracuda::", op, ": block_size=(", block_q, ", ",
              block_k, ") must be positive");
  TORCH_CHECK(!scale.has_value() || std::isfinite(*scale), "baracuda::", op, ": scale=",
              scale.value_or(0.0), " must be finite");
  TORCH_CHECK(block_mask.device() == q.device(), "baracuda::", op, ": block_mask is on ",
              block_mask.device(), " but q is on ", q.device());
  const int64_t nbq = (Lq + block_q - 1) / block_q, nbk = (k.size(2) + block_k - 1) / block_k;
  at::Tensor mask = mask_as_4d(op, block_mask, nbq, nbk);
  const bool batch_ok = mask.size(0) == B || mask.size(0) == 1;
  const bool heads_ok = mask.size(1) == H || mask.size(1) == 1;
  TORCH_CHECK(batch_ok && heads_ok && mask.size(2) == nbq && mask.size(3) == nbk, "baracuda::",
              op, ": block_mask.shape=", mask.sizes(), " must be [", B, " or 1, ", H, " or 1, ",
              nbq, ", ", nbk, "] (ceil(", Lq, " / ", block_q, ") query blocks, ceil(", k.size(2),
              " / ", block_k, ") key blocks)");
  AttentionProblem p{q, k, v, mask, block_q, block_k, nbq, nbk,
                     scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(D)), causal};
  const c10::string_view align = element.causal_align;
  TORCH_CHECK(align == "top_left" || align == "bottom_right", "baracuda::", op,
              ": causal_align=\"", std::string(align), "\" must be \"top_left\" or \"bottom_right\"");
  p.bottom_right = align == "bottom_right";
  if (element.kv_lens.has_value()) {
    const at::Tensor& n = *element.kv_lens;
    TORCH_CHECK(n.layout() == at::kStrided &&
                    (n.scalar_type() == at::kInt || n.scalar_type() == at::kLong),
                "baracuda::", op, ": kv_lens must be a strided int32 or int64 tensor, got ",
                n.scalar_type());
    TORCH_CHECK(n.device() == q.device(), "baracuda::", op, ": kv_lens is on ", n.device(),
                " but q is on ", q.device());
    TORCH_CHECK(n.dim() == 1 && n.size(0) == B, "baracuda::", op, ": kv_lens.shape=", n.sizes(),
                " must be [", B, "] (one length per batch row)");
    p.kv_lens = n;
    if (n.is_cpu() && B > 0) {
      // Host lengths are checked; device ones are clamped to [0, S_max] by
      // the kernels (checking them would cost a host sync per call).
      const at::Tensor len = n.to(at::kLong);
      const int64_t* l = len.const_data_ptr<int64_t>();
      for (int64_t b = 0; b < B; ++b) {
        const int64_t lb = l[b * len.stride(0)];
        TORCH_CHECK(lb >= 0 && lb <= k.size(2), "baracuda::", op, ": kv_lens[", b, "]=", lb,
                    " must be in [0, ", k.size(2), "] (the cache's length)");
      }
    }
  }
  p.window_left = window_side(op, "window_left", element.window_left);
  p.window_right = window_side(op, "window_right", element.window_right);
  const bool has_q_ids = element.q_document_ids.has_value();
  TORCH_CHECK(has_q_ids == element.kv_document_ids.has_value(), "baracuda::", op,
              ": document ids need both q_document_ids and kv_document_ids (got only ",
              has_q_ids ? "q_document_ids" : "kv_document_ids", ")");
  if (has_q_ids) {
    p.q_documents = document_ids(op, "q_document_ids", *element.q_document_ids, B, Lq, q);
    p.kv_documents = document_ids(op, "kv_document_ids", *element.kv_document_ids, B, k.size(2), q);
  }
  const bool has_index = element.partial_index.has_value();
  TORCH_CHECK(has_index == element.partial_bits.has_value(), "baracuda::", op,
              ": an exact mask needs both partial_index and partial_bits (got only ",
              has_index ? "partial_index" : "partial_bits", ")");
  if (has_index) partial_tiles(op, *element.partial_index, *element.partial_bits, p);
  return p;
}

BlockSparseAttentionArgs attention_args(const AttentionProblem& p, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& out, const at::Tensor& lse) {
  BlockSparseAttentionArgs a;
  a.dtype = float_dtype_of("block_sparse_attention", "q", q);
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
  a.bottom_right = p.bottom_right;
  if (p.kv_lens.defined()) {
    a.kv_lens = p.kv_lens.const_data_ptr();
    a.kv_lens_stride = p.kv_lens.stride(0);
    a.kv_lens_int32 = p.kv_lens.scalar_type() == at::kInt;
  }
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  if (p.q_documents.defined()) {
    a.q_documents = p.q_documents.const_data_ptr<int64_t>();
    a.kv_documents = p.kv_documents.const_data_ptr<int64_t>();
    a.q_documents_stride = p.q_documents.size(0) == 1 ? 0 : p.q_documents.stride(0);
    a.kv_documents_stride = p.kv_documents.size(0) == 1 ? 0 : p.kv_documents.stride(0);
  }
  if (p.partial_index.defined()) {
    a.partial_index = p.partial_index.const_data_ptr<int32_t>();
    strides_of(a.partial_index_strides, p.partial_index);
    a.partial_bits = reinterpret_cast<const uint32_t*>(p.partial_bits.const_data_ptr<int32_t>());
    a.bit_words = p.partial_bits.size(2);
  }
  a.q = q.const_data_ptr();
  a.k = k.const_data_ptr();
  a.v = v.const_data_ptr();
  a.out = out.defined() ? out.data_ptr() : nullptr;
  a.lse = lse.defined() ? lse.data_ptr() : nullptr;
  a.mask = static_cast<const uint8_t*>(p.mask.const_data_ptr());
  strides_of(a.q_strides, q);
  strides_of(a.k_strides, k);
  strides_of(a.v_strides, v);
  strides_of(a.out_strides, out.defined() ? out : q);
  strides_of(a.mask_strides, p.mask);
  if (lse.defined()) strides_of(a.lse_strides, lse);
  return a;
}


at::Tensor tensor_core_ready(const at::Tensor& t) {
  const bool ok = t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0 &&
                  (t.size(0) == 1 || t.stride(0) % 8 == 0) &&
                  (t.size(1) == 1 || t.stride(1) % 8 == 0) &&
                  (t.size(2) == 1 || (t.stride(2) % 8 == 0 && t.stride(2) != 0));
  return ok ? t : t.clone(at::MemoryFormat::Contiguous);
}

bool tensor_core_shape(const AttentionProblem& p, bool hopper) {
  const auto s = p.q.scalar_type();
  const int64_t D = p.q.size(3);
  // Document ids and 256-wide heads: only the Hopper kernels take them (the
  // mma.sync one does not).
  const bool documents_ok = !p.q_documents.defined() || hopper;
  const bool dims_ok = D == 64 || D == 128 || (D == 256 && hopper);
  return (s == at::kHalf || s == at::kBFloat16) && p.v.size(3) == D && dims_ok &&
         p.block_q % 64 == 0 && p.block_k % 64 == 0 && documents_ok;
}

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

at::ScalarType attention_lse_dtype(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace baracuda
