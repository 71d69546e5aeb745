// Autograd of block-sparse attention, in C++ as for every family: a call
// that needs no graph goes straight below autograd (no Python on the way),
// and one that does records one node whose backward is the
// block_sparse_attention_backward op. That op's own node refuses a double
// backward (no_double_backward.h).
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

#include "common/forward_ad.h"
#include "common/no_double_backward.h"
#include "common/op_handle.h"

namespace baracuda {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using OptionalSymInt = std::optional<c10::SymInt>;
using OptionalTensor = std::optional<at::Tensor>;

// The schemas' trailing element conditions (registry.cpp: ELEMENT_ARGUMENTS).
#define ELEMENT_TYPES                                                                        \
  c10::string_view, OptionalSymInt, OptionalSymInt, const OptionalTensor&, const OptionalTensor&, \
      const OptionalTensor&, const OptionalTensor&, const OptionalTensor&
#define ELEMENT_PARAMETERS                                                            \
  c10::string_view causal_align, OptionalSymInt window_left, OptionalSymInt window_right,   \
      const OptionalTensor &q_document_ids, const OptionalTensor &kv_document_ids,          \
      const OptionalTensor &partial_index, const OptionalTensor &partial_bits,              \
      const OptionalTensor &kv_lens
#define ELEMENT_VALUES                                                                  \
  causal_align, window_left, window_right, q_document_ids, kv_document_ids, partial_index, \
      partial_bits, kv_lens

using AttentionFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                       const at::Tensor&, const at::Tensor&,
                                                       int64_t, int64_t, std::optional<double>,
                                                       bool, ELEMENT_TYPES);
using AttentionBackwardFn = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const OptionalTensor&, const OptionalTensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
    int64_t, std::optional<double>, bool, ELEMENT_TYPES);

const c10::TypedOperatorHandle<AttentionFn>& attention_op() {
  static const auto op = find_op<AttentionFn>("baracuda::block_sparse_attention");
  return op;
}
const c10::TypedOperatorHandle<AttentionBackwardFn>& attention_backward_op() {
  static const auto op =
      find_op<AttentionBackwardFn>("baracuda::block_sparse_attention_backward");
  return op;
}

bool needs_graph(const at::Tensor& t) { return t.requires_grad(); }

std::optional<at::Tensor> if_defined(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// (out, lse) = attention(q, k, v); both outputs are differentiable. The
// backward reads q, k, v, out and lse; an output the caller did not use
// brings an undefined gradient (not zeros), which the backward op takes as
// "no such term".
struct Attention : public torch::autograd::Function<Attention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& block_mask,
                               int64_t block_q, int64_t block_k, std::optional<double> scale,
                               bool is_causal, const std::string& causal_align,
                               OptionalSymInt window_left, OptionalSymInt window_right,
                               const OptionalTensor& q_document_ids,
                               const OptionalTensor& kv_document_ids,
                               const OptionalTensor& partial_index,
                               const OptionalTensor& partial_bits,
                               const OptionalTensor& kv_lens) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, lse] = attention_op().call(q, k, v, block_mask, block_q, block_k, scale,
                                          is_causal, ELEMENT_VALUES);
    ctx->save_for_backward({q, k, v, out, lse, block_mask,
                            q_document_ids.value_or(at::Tensor()),
                            kv_document_ids.value_or(at::Tensor()),
                            partial_index.value_or(at::Tensor()),
                            partial_bits.value_or(at::Tensor()),
                            kv_lens.value_or(at::Tensor())});
    ctx->saved_data["block_q"] = block_q;
    ctx->saved_data["block_k"] = block_k;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["causal_align"] = causal_align;
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    ctx->set_materialize_grads(false);
    return {out, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list none(16);
    if (!grads[0].defined() && !grads[1].defined()) return none;
    const variable_list s = ctx->get_saved_variables();
    const auto& d = ctx->saved_data;
    const c10::IValue& scale = d.at("scale");
    auto [dq, dk, dv] = attention_backward_op().call(
        if_defined(grads[0]), if_defined(grads[1]), s[0], s[1], s[2], s[3], s[4], s[5],
        d.at("block_q").toInt(), d.at("block_k").toInt(),
        scale.isNone() ? std::nullopt : std::optional<double>(scale.toDouble()),
        d.at("is_causal").toBool(), d.at("causal_align").toStringRef(),
        d.at("window_left").toOptional<c10::SymInt>(),
        d.at("window_right").toOptional<c10::SymInt>(), if_defined(s[6]), if_defined(s[7]),
        if_defined(s[8]), if_defined(s[9]), if_defined(s[10]));
    variable_list result = none;
    result[0] = dq;
    result[1] = dk;
    result[2] = dv;
    return result;
  }
};

constexpr char kAttentionBackward[] = "baracuda::block_sparse_attention_backward";

std::tuple<at::Tensor, at::Tensor> attention_autograd(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v,
                                                      const at::Tensor& block_mask,
                                                      int64_t block_q, int64_t block_k,
                                                      std::optional<double> scale, bool is_causal,
                                                      ELEMENT_PARAMETERS) {
  refuse_tangents("baracuda::block_sparse_attention", q, k, v);
  if (!c10::GradMode::is_enabled() || !(needs_graph(q) || needs_graph(k) || needs_graph(v))) {
    at::AutoDispatchBelowADInplaceOrView below;
    return attention_op().call(q, k, v, block_mask, block_q, block_k, scale, is_causal,
                               ELEMENT_VALUES);
  }
  const variable_list r =
      Attention::apply(q, k, v, block_mask, block_q, block_k, scale, is_causal,
                       std::string(causal_align), window_left, window_right, q_document_ids,
                       kv_document_ids, partial_index, partial_bits, kv_lens);
  return {r[0], r[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_autograd(
    const OptionalTensor& grad_out, const OptionalTensor& grad_lse, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& block_mask, int64_t block_q, int64_t block_k, std::optional<double> scale,
    bool is_causal, ELEMENT_PARAMETERS) {
  refuse_tangents(kAttentionBackward, grad_out, grad_lse, q, k, v, out, lse);
  const variable_list r = backward_outputs<kAttentionBackward>(
      {grad_out.value_or(at::Tensor()), grad_lse.value_or(at::Tensor()), q, k, v, out, lse},
      [&]() -> variable_list {
        auto [dq, dk, dv] =
            attention_backward_op().call(grad_out, grad_lse, q, k, v, out, lse, block_mask,
                                         block_q, block_k, scale, is_causal, ELEMENT_VALUES);
        return {dq, dk, dv};
      });
  return {r[0], r[1], r[2]};
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("block_sparse_attention", &attention_autograd);
  m.impl("block_sparse_attention_backward", &attention_backward_autograd);
}

}  // namespace baracuda
