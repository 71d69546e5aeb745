// Forward-mode AD (dual tensors, torch.func.jvp) has no formulas in this
// library. An op's Autograd kernel refuses an input that carries a tangent,
// naming the op, before anything runs: below autograd the tangent would be
// dropped, and the output would look like one whose tangent is zero.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>

namespace baracuda {

inline bool has_tangent(const at::Tensor& t) { return t.defined() && t._fw_grad(0).defined(); }

inline bool has_tangent(const std::optional<at::Tensor>& t) {
  return t.has_value() && has_tangent(*t);
}

template <typename... Tensors>
inline void refuse_tangents(const char* op, const Tensors&... tensors) {
  TORCH_CHECK(!(has_tangent(tensors) || ...), op,
              ": forward-mode AD (a dual tensor, torch.func.jvp) is not supported; use reverse "
              "mode (backward, torch.autograd.grad, torch.func.vjp)");
}

}  // namespace baracuda
