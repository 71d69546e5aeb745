// Autograd of the merges, in C++ as for every family. merge_state and
// merge_states record one node whose backward is their fused backward op;
// a call that needs no graph goes straight below autograd. The backward ops
// have no derivative of their own, and their node says so when a double
// backward reaches it.
//
// merge_state_ is not differentiable (its backward would need the states it
// overwrites; merge_state is the differentiable form), and without a kernel
// here autograd let it through: v and s kept their old history, whose
// gradient was then silently wrong. A call that would join a graph is
// refused before anything is written, and the version counters of v and s
// are bumped at ADInplaceOrView, as torch's own in-place ops do, so tensors
// saved before the merge are checked.
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/util/string_view.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

#include "common/forward_ad.h"
#include "common/no_double_backward.h"
#include "common/op_handle.h"

namespace baracuda {
namespace {

using MergeInPlaceFn = void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, c10::string_view);

const c10::TypedOperatorHandle<MergeInPlaceFn>& merge_state_op() {
  static const auto op = find_op<MergeInPlaceFn>("baracuda::merge_state_");
  return op;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using MergeFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&,
                                                   c10::string_view);
using MergeManyFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                       c10::string_view);
using MergeBackwardFn = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, c10::string_view);
using MergeManyBackwardFn = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&,
    c10::string_view);

const c10::TypedOperatorHandle<MergeFn>& merge_op() {
  static const auto op = find_op<MergeFn>("baracuda::merge_state");
  return op;
}
const c10::TypedOperatorHandle<MergeManyFn>& merge_many_op() {
  static const auto op = find_op<MergeManyFn>("baracuda::merge_states");
  return op;
}
const c10::TypedOperatorHandle<MergeBackwardFn>& merge_backward_op() {
  static const auto op = find_op<MergeBackwardFn>("baracuda::merge_state_backward");
  return op;
}
const c10::TypedOperatorHandle<MergeManyBackwardFn>& merge_many_backward_op() {
  static const auto op = find_op<MergeManyBackwardFn>("baracuda::merge_states_backward");
  return op;
}

bool any_requires_grad(std::initializer_list<const at::Tensor*> ts) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

std::optional<at::Tensor> if_defined(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// An output the caller did not use brings an undefined gradient: the
// kernels take zeros for grad_v and "no term" for grad_s.
at::Tensor dense_grad(const at::Tensor& grad, const at::Tensor& like,
                      c10::SymIntArrayRef shape) {
  return grad.defined() ? grad : at::zeros_symint(shape, like.options());
}

struct Merge : public torch::autograd::Function<Merge> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& v_a, const at::Tensor& s_a,
                               const at::Tensor& v_b, const at::Tensor& s_b,
                               const std::string& lse_base) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [v, s] = merge_op().call(v_a, s_a, v_b, s_b, lse_base);
    ctx->save_for_backward({v_a, s_a, v_b, s_b});
    ctx->saved_data["lse_base"] = lse_base;
    ctx->set_materialize_grads(false);
    return {v, s};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined() && !grads[1].defined()) return variable_list(5);
    const variable_list x = ctx->get_saved_variables();
    auto [gva, gsa, gvb, gsb] = merge_backward_op().call(
        dense_grad(grads[0], x[0], x[0].sym_sizes()), if_defined(grads[1]), x[0], x[1], x[2],
        x[3], ctx->saved_data["lse_base"].toStringRef());
    return {gva, gsa, gvb, gsb, at::Tensor()};
  }
};

struct MergeMany : public torch::autograd::Function<MergeMany> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& v, const at::Tensor& s,
                               const std::string& lse_base) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [v_out, s_out] = merge_many_op().call(v, s, lse_base);
    ctx->save_for_backward({v, s});
    ctx->saved_data["lse_base"] = lse_base;
    ctx->set_materialize_grads(false);
    return {v_out, s_out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined() && !grads[1].defined()) return variable_list(3);
    const variable_list x = ctx->get_saved_variables();
    // The merged v's shape: v's without its axis -3 (the states).
    std::vector<c10::SymInt> merged = x[0].sym_sizes().vec();
    merged.erase(merged.end() - 3);
    auto [gv, gs] = merge_many_backward_op().call(dense_grad(grads[0], x[0], merged),
                                                  if_defined(grads[1]), x[0], x[1],
                                                  ctx->saved_data["lse_base"].toStringRef());
    return {gv, gs, at::Tensor()};
  }
};

constexpr char kMergeBackward[] = "baracuda::merge_state_backward";
constexpr char kMergeManyBackward[] = "baracuda::merge_states_backward";

std::tuple<at::Tensor, at::Tensor> merge_autograd(const at::Tensor& v_a, const at::Tensor& s_a,
                                                  const at::Tensor& v_b, const at::Tensor& s_b,
                                                  c10::string_view lse_base) {
  refuse_tangents("baracuda::merge_state", v_a, s_a, v_b, s_b);
  if (!any_requires_grad({&v_a, &s_a, &v_b, &s_b})) {
    at::AutoDispatchBelowADInplaceOrView below;
    return merge_op().call(v_a, s_a, v_b, s_b, lse_base);
  }
  const variable_list r = Merge::apply(v_a, s_a, v_b, s_b, std::string(lse_base));
  return {r[0], r[1]};
}

std::tuple<at::Tensor, at::Tensor> merge_many_autograd(const at::Tensor& v, const at::Tensor& s,
                                                       c10::string_view lse_base) {
  refuse_tangents("baracuda::merge_states", v, s);
  if (!any_requires_grad({&v, &s})) {
    at::AutoDispatchBelowADInplaceOrView below;
    return merge_many_op().call(v, s, lse_base);
  }
  const variable_list r = MergeMany::apply(v, s, std::string(lse_base));
  return {r[0], r[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> merge_backward_autograd(
    const at::Tensor& grad_v, const std::optional<at::Tensor>& grad_s, const at::Tensor& v_a,
    const at::Tensor& s_a, const at::Tensor& v_b, const at::Tensor& s_b,
    c10::string_view lse_base) {
  refuse_tangents(kMergeBackward, grad_v, grad_s, v_a, s_a, v_b, s_b);
  const variable_list r = backward_outputs<kMergeBackward>(
      {grad_v, grad_s.value_or(at::Tensor()), v_a, s_a, v_b, s_b}, [&]() -> variable_list {
        auto [a, b, c, d] =
            merge_backward_op().call(grad_v, grad_s, v_a, s_a, v_b, s_b, lse_base);
        return {a, b, c, d};
      });
  return {r[0], r[1], r[2], r[3]};
}

std::tuple<at::Tensor, at::Tensor> merge_many_backward_autograd(
    const at::Tensor& grad_v, const std::optional<at::Tensor>& grad_s, const at::Tensor& v,
    const at::Tensor& s, c10::string_view lse_base) {
  refuse_tangents(kMergeManyBackward, grad_v, grad_s, v, s);
  const variable_list r = backward_outputs<kMergeManyBackward>(
      {grad_v, grad_s.value_or(at::Tensor()), v, s}, [&]() -> variable_list {
        auto [a, b] = merge_many_backward_op().call(grad_v, grad_s, v, s, lse_base);
        return {a, b};
      });
  return {r[0], r[1]};
}

void merge_state_autograd(const at::Tensor& v, const at::Tensor& s, const at::Tensor& v_other,
                          const at::Tensor& s_other, c10::string_view lse_base) {
  refuse_tangents("baracuda::merge_state_", v, s, v_other, s_other);
  if (c10::GradMode::is_enabled()) {
    std::string needing_grad;
    const char* const names[] = {"v", "s", "v_other", "s_other"};
    const at::Tensor* const inputs[] = {&v, &s, &v_other, &s_other};
    for (int i = 0; i < 4; ++i) {
      if (!inputs[i]->requires_grad()) continue;
      needing_grad += needing_grad.empty() ? names[i] : std::string(", ") + names[i];
    }
    TORCH_CHECK(needing_grad.empty(), "baracuda::merge_state_: the in-place merge is not "
                "differentiable, but ", needing_grad, " requires grad; use merge_state, or "
                "call it under torch.no_grad()");
  }
  at::AutoDispatchBelowAutograd below;
  merge_state_op().call(v, s, v_other, s_other, lse_base);
}

void merge_state_bump_versions(const at::Tensor& v, const at::Tensor& s,
                               const at::Tensor& v_other, const at::Tensor& s_other,
                               c10::string_view lse_base) {
  {
    at::AutoDispatchBelowADInplaceOrView below;
    merge_state_op().call(v, s, v_other, s_other, lse_base);
  }
  torch::autograd::increment_version(v);
  torch::autograd::increment_version(s);
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("merge_state", &merge_autograd);
  m.impl("merge_states", &merge_many_autograd);
  m.impl("merge_state_backward", &merge_backward_autograd);
  m.impl("merge_states_backward", &merge_many_backward_autograd);
  m.impl("merge_state_", &merge_state_autograd);
}

TORCH_LIBRARY_IMPL(baracuda, ADInplaceOrView, m) {
  m.impl("merge_state_", &merge_state_bump_versions);
}

}  // namespace baracuda
