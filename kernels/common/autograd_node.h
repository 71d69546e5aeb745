// A plain autograd node for an op's forward, as torch's generated nodes are:
// the forward records one Node with the edges of its differentiable inputs
// and the history of its differentiable outputs. `torch::autograd::Function`
// does the same through a general context (a hash map of saved IValues, the
// wrapping of every output), which on a small eager call costs a few
// microseconds more than the kernel launch it wraps; a node with typed
// members does not.
#pragma once

#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <memory>
#include <type_traits>

namespace baracuda {

// A new node of type N (a torch::autograd::Node), held as the autograd
// graph holds nodes: std::shared_ptr with torch's deleter up to torch 2.11,
// c10::intrusive_ptr after.
template <typename N>
auto make_node() {
  using Held = decltype(torch::autograd::Edge::function);
  if constexpr (std::is_same_v<Held, std::shared_ptr<torch::autograd::Node>>) {
    // deleteNode frees long chains of nodes without deep recursion; the call
    // depends on N, so it is looked up only where this branch is compiled.
    return std::shared_ptr<N>(new N(), [](N* node) { deleteNode(node); });
  } else {
    return c10::make_intrusive<N>();
  }
}

}  // namespace baracuda
