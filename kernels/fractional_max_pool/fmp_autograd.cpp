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
#include <vector>

#include "common/autograd_node.h"
#include "common/forward_ad.h"
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
  refuse_tangents("baracuda::fractional_max_pool_backward", grad_out);
  if (!c10::GradMode::is_enabled() || !grad_out.requires_grad()) {
    at::AutoDispatchBelowADInplaceOrView below;
    return pool_backward_op().call(grad_out, indices, samples, input_size, kernel_size,
                                   placement);
  }
  return PoolBackward::apply(grad_out, indices, samples, input_size, kernel_size,
                             std::string(placement));
}

// The pool's node: grad_x from the gradient of out (the indices carry none).
// A plain node rather than a Function (see common/autograd_node.h): this is
// the op's hot path under autograd.
struct PoolNode : public torch::autograd::Node {
  torch::autograd::SavedVariable indices, samples;
  std::vector<c10::SymInt> input_size;
  std::vector<int64_t> kernel_size;
  std::string placement;

  std::string name() const override { return "FractionalMaxPoolBackward"; }

  variable_list apply(variable_list&& grads) override {
    variable_list grad_x(1);
    if (!grads[0].defined() || !task_should_compute_output(0)) return grad_x;
    grad_x[0] = pool_backward_graph(grads[0], indices.unpack(), samples.unpack(), input_size,
                                    kernel_size, placement);
    return grad_x;
  }

  void release_variables() override {
    indices.reset_data();
    samples.reset_data();
  }
};

std::tuple<at::Tensor, at::Tensor> pool_graph(const at::Tensor& x, at::IntArrayRef kernel_size,
                                              c10::SymIntArrayRef output_size,
                                              const at::Tensor& samples,
                                              c10::string_view placement) {
  refuse_tangents("baracuda::fractional_max_pool", x, samples);
  auto result = [&] {
    at::AutoDispatchBelowADInplaceOrView below;
    return pool_op().call(x, kernel_size, output_size, samples, placement);
  }();
  if (!torch::autograd::compute_requires_grad(x)) return result;
  const auto node = make_node<PoolNode>();
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  node->indices = torch::autograd::SavedVariable(std::get<1>(result), false);
  node->samples = torch::autograd::SavedVariable(samples, false);
  node->input_size = x.sym_sizes().vec();
  node->kernel_size = kernel_size.vec();
  node->placement = std::string(placement);
  torch::autograd::set_history(std::get<0>(result), node);
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("fractional_max_pool", &pool_graph);
  m.impl("fractional_max_pool_backward", &pool_backward_graph);
}

}  // namespace baracuda
