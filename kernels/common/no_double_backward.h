// The node of a backward op that has no derivative of its own: its outputs
// join a graph only when a double backward is asked for (create_graph=True),
// and that backward is refused, naming the op, when it runs. Without it
// autograd would let the gradient of the gradient through as if it were
// zero.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <initializer_list>

namespace baracuda {

// `call()` runs the op below autograd; `inputs` are the node's edges, the
// op's defined tensor arguments (see backward_outputs). kName: the op's name,
// for the message.
template <const char* kName>
struct NoDoubleBackward : public torch::autograd::Function<NoDoubleBackward<kName>> {
  template <typename Call>
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext*,
                                                at::TensorList /*inputs*/, Call call) {
    at::AutoDispatchBelowADInplaceOrView below;
    return call();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list) {
    TORCH_CHECK(false, kName, ": double backward (a gradient of the gradient) is not supported");
  }
};

// The outputs of a backward op: straight from `call()` below autograd when no
// input requires grad (the usual case), else through a NoDoubleBackward
// node whose edges are the defined inputs (an absent optional has none).
template <const char* kName, typename Call>
torch::autograd::variable_list backward_outputs(std::initializer_list<at::Tensor> inputs,
                                                Call call) {
  torch::autograd::variable_list edges;
  bool graph = false;
  for (const at::Tensor& t : inputs) {
    if (!t.defined()) continue;
    edges.push_back(t);
    graph = graph || t.requires_grad();
  }
  if (!c10::GradMode::is_enabled() || !graph) {
    at::AutoDispatchBelowADInplaceOrView below;
    return call();
  }
  return NoDoubleBackward<kName>::apply(at::TensorList(edges), call);
}

}  // namespace baracuda
