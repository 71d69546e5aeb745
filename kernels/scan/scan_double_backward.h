// The vector-Jacobian product of scan_backward (scan_double_backward.cpp),
// for scan_backward's autograd node.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace baracuda {

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
