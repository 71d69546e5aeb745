// Autograd of fractional max pooling, in C++ as for every family: a call that
// needs no graph goes straight below autograd, one that does records one
// node. The pool's backward is the fractional_max_pool_backward op; that op
// is linear in grad_out (a scatter of it at the indices), so its own
// gradient is the gather at the same indices, built of differentiable torch
// ops: every higher derivative follows.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/string_view.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "common/op_handle.h"

namespace baracuda {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using PoolFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, at::IntArrayRef,
                                                  c10::SymIntArrayRef, const at::Tensor&,
                                                  c10::string_view);
using PoolBackwardFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  c10::SymIntArrayRef, at::IntArrayRef, c10::string_view);

const c10::TypedOperatorHandle<PoolFn>& pool_op() {
  static const auto op = find_op<PoolFn>("baracuda::fractional_max_pool");
  return op;
}
const c10::TypedOperatorHandle<PoolBackwardFn>& pool_backward_op() {
  static const auto op = find_op<PoolBackwardFn>("baracuda::fractional_max_pool_backward");
  return op;
}

// values[..., indices] per (n, c) plane: the adjoint of the backward's scatter.
at::Tensor gather_at(const at::Tensor& values, const at::Tensor& indices, int64_t dims) {
  const at::Tensor picked =
      at::gather(values.flatten(values.dim() - dims), -1, indices.flatten(indices.dim() - dims));
  return picked.view_symint(indices.sym_sizes());
}

// The backward op: grad_x from grad_out; differentiable in grad_out alone.
struct PoolBackward : public torch::autograd::Function<PoolBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_out,
                            const at::Tensor& indices, const at::Tensor& samples,
                            c10::SymIntArrayRef input_size, at::IntArrayRef kernel_size,
                            const std::string& placement) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor grad_x =
        pool_backward_op().call(grad_out, indices, samples, input_size, kernel_size, placement);
    ctx->save_for_backward({indices});
    ctx->saved_data["dims"] = static_cast<int64_t>(kernel_size.size());
    return grad_x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor indices = ctx->get_saved_variables()[0];
    return {gather_at(grads[0], indices, ctx->saved_data["dims"].toInt()), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor pool_backward_graph(const at::Tensor& grad_out, const at::Tensor& indices,
                               const at::Tensor& samples, c10::SymIntArrayRef input_size,
                               at::IntArrayRef kernel_size, c10::string_view placement) {
  if (!c10::GradMode::is_enabled() || !grad_out.requires_grad()) {
    at::AutoDispatchBelowADInplaceOrView below;
    return pool_backward_op().call(grad_out, indices, samples, input_size, kernel_size,
                                   placement);
  }
  return PoolBackward::apply(grad_out, indices, samples, input_size, kernel_size,
                             std::string(placement));
}

// (out, indices) = pool(x); the indices carry no gradient.
struct Pool : public torch::autograd::Function<Pool> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               at::IntArrayRef kernel_size, c10::SymIntArrayRef output_size,
                               const at::Tensor& samples, const std::string& placement) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, indices] = pool_op().call(x, kernel_size, output_size, samples, placement);
    ctx->save_for_backward({indices, samples});
    ctx->saved_data["input_size"] = x.sym_sizes();
    ctx->saved_data["kernel_size"] = kernel_size;
    ctx->saved_data["placement"] = placement;
    ctx->mark_non_differentiable({indices});
    // Unmaterialised: autograd would otherwise fill a zero int64 gradient
    // for the indices on every backward (an allocation and a kernel).
    ctx->set_materialize_grads(false);
    return {out, indices};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<c10::SymInt> input_size = ctx->saved_data["input_size"].toSymIntVector();
    const std::vector<int64_t> kernel_size = ctx->saved_data["kernel_size"].toIntVector();
    // Undefined where only the indices were used: x's gradient is then zero,
    // which an undefined gradient says.
    if (!grads[0].defined()) return variable_list(5);
    const at::Tensor grad_x = pool_backward_graph(grads[0], saved[0], saved[1], input_size,
                                                  kernel_size,
                                                  ctx->saved_data["placement"].toStringRef());
    return {grad_x, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> pool_graph(const at::Tensor& x, at::IntArrayRef kernel_size,
                                              c10::SymIntArrayRef output_size,
                                              const at::Tensor& samples,
                                              c10::string_view placement) {
  if (!c10::GradMode::is_enabled() || !x.requires_grad()) {
    at::AutoDispatchBelowADInplaceOrView below;
    return pool_op().call(x, kernel_size, output_size, samples, placement);
  }
  const variable_list r = Pool::apply(x, kernel_size, output_size, samples,
                                      std::string(placement));
  return {r[0], r[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("fractional_max_pool", &pool_graph);
  m.impl("fractional_max_pool_backward", &pool_backward_graph);
}

}  // namespace baracuda
