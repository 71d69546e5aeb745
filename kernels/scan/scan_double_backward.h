// scan_backward called through the dispatcher, and its vector-Jacobian
// product (scan_double_backward.cpp) for scan_backward's autograd node.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <string>

namespace baracuda {

// baracuda::scan_backward with the optional tensors passed as undefined
// ones where absent.
at::Tensor scan_backward_op(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& y,
                            const at::Tensor& indices, int64_t dim, c10::string_view kind,
                            bool reverse);

// What a scan_backward call keeps for its own backward: `grad` (the dy it
// was given), x and y for cumprod and logcumsumexp, dx (its output) for
// logcumsumexp, the indices for cummax / cummin; undefined where unused.
// dim is within [0, rank) (0 for a 0-d tensor).
struct ScanBackwardSaved {
  at::Tensor grad, x, y, indices, dx;
  int64_t dim = 0;
  std::string kind;
  bool reverse = false;
};

// Gradients with respect to scan_backward's (grad, x, y), given the gradient
// `gg` of its output; undefined where the kind does not read that input.
struct ScanBackwardVjp {
  at::Tensor grad, x, y;
};

ScanBackwardVjp scan_backward_vjp(const at::Tensor& gg, const ScanBackwardSaved& saved);

}  // namespace baracuda
