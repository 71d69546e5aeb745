// Autograd of linear_scan and linear_scan_backward, in C++ as for the other
// scans (scan_autograd.cpp): a call that needs no graph goes straight below
// autograd, one that does records one node.
//
// linear_scan's backward is linear_scan_backward, plus h0's gradient
// a_0 db_0 (summed over the axes h0 was broadcast along).
//
// linear_scan_backward's own vector-Jacobian product (double backward):
// with g = db (the gradient reaching h) and h_prev = h one scan position
// earlier (h0, or zero, at the first), da = g h_prev and g = M dh, M the
// reverse recurrence. Given the gradients u of da and v of db, the gradient
// reaching g is w = v + u h_prev; M's adjoint is the forward recurrence, so
// dh's gradient is z = linear_scan(a, w); a enters M one position later, so
// a's gradient is z one position earlier times g; h's is u g one position
// later; h0's is u_0 g_0. Every piece is a differentiable op, linear_scan
// among them, so higher orders work too.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "common/forward_ad.h"
#include "common/op_handle.h"
#include "scan/scan_op_support.h"

namespace baracuda {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using scan_op::first_slice;
using scan_op::scan_axis;

using LinearScanFn = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, bool,
                                const std::optional<at::Tensor>&);
using LinearScanBackwardFn = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
    int64_t, bool);

const c10::TypedOperatorHandle<LinearScanFn>& linear_scan_op() {
  static const auto op = find_op<LinearScanFn>("baracuda::linear_scan");
  return op;
}
const c10::TypedOperatorHandle<LinearScanBackwardFn>& linear_scan_backward_op() {
  static const auto op = find_op<LinearScanBackwardFn>("baracuda::linear_scan_backward");
  return op;
}

bool needs_graph(const at::Tensor& t) {
  return c10::GradMode::is_enabled() && t.defined() && t.requires_grad();
}
bool needs_graph(const std::optional<at::Tensor>& t) { return t.has_value() && needs_graph(*t); }

std::optional<at::Tensor> maybe(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// t moved one position along the scan: each position gets the value of the
// one before it in scan order (`fill` at the first), or with `later` the one
// after it (`fill` at the last). `fill` has t's shape without dim.
at::Tensor stepped(const at::Tensor& t, int64_t dim, bool reverse, const at::Tensor& fill,
                   bool later) {
  if (t.dim() == 0) return fill.reshape({});
  const int64_t d = scan_axis(t, dim);
  const c10::SymInt n = t.sym_size(d);
  if (n == 0) return t;
  const at::Tensor edge = fill.unsqueeze(d);
  if (later == reverse) return at::cat({edge, t.narrow_symint(d, 0, n - 1)}, d);  // toward the end
  return at::cat({t.narrow_symint(d, 1, n - 1), edge}, d);
}

// h0's gradient from the first positions of x and g: x_0 g_0, summed over
// the axes h0 was broadcast along, in h0's dtype.
at::Tensor h0_grad(const at::Tensor& x, const at::Tensor& g, const at::Tensor& h0, int64_t dim,
                   bool reverse) {
  if (x.dim() > 0 && x.sym_size(scan_axis(x, dim)) == 0) return at::zeros_like(h0);
  const at::Tensor term = first_slice(x, dim, reverse) * first_slice(g, dim, reverse);
  return term.to(h0.scalar_type()).sum_to_size_symint(h0.sym_sizes());
}

struct LinearScan : public torch::autograd::Function<LinearScan> {
  // h0 is optional, not an undefined tensor: autograd describes every tensor
  // input, and an undefined one has no device.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const std::optional<at::Tensor>& h0, int64_t dim, bool reverse) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor h = linear_scan_op().call(a, b, dim, reverse, h0);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["reverse"] = reverse;
    ctx->save_for_backward({a, h, h0.value_or(at::Tensor())});
    return h;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &h = saved[1], &h0 = saved[2];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const bool reverse = ctx->saved_data["reverse"].toBool();
    auto [da, db] = linear_scan_backward_op().call(grads[0], a, h, maybe(h0), dim, reverse);
    at::Tensor dh0;
    if (h0.defined() && ctx->needs_input_grad(2)) dh0 = h0_grad(a, db, h0, dim, reverse);
    return {da, db, dh0, at::Tensor(), at::Tensor()};
  }
};

struct LinearScanBackward : public torch::autograd::Function<LinearScanBackward> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad, const at::Tensor& a,
                               const at::Tensor& h, const std::optional<at::Tensor>& h0,
                               int64_t dim, bool reverse) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [da, db] = linear_scan_backward_op().call(grad, a, h, h0, dim, reverse);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["reverse"] = reverse;
    ctx->save_for_backward({a, h, h0.value_or(at::Tensor()), db});
    return {da, db};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &h = saved[1], &h0 = saved[2], &g = saved[3];
    const at::Tensor &u = grads[0], &v = grads[1];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const bool reverse = ctx->saved_data["reverse"].toBool();
    const at::Tensor zeros = at::zeros_like(first_slice(g, dim, false));
    at::Tensor w = v.defined() ? v : at::zeros_like(g);
    if (u.defined()) {
      const at::Tensor fill = h0.defined() ? h0.to(h.scalar_type()).expand_as(zeros) : zeros;
      w = w + u * stepped(h, dim, reverse, fill, /*later=*/false);
    }
    const at::Tensor z = linear_scan_op().call(a, w, dim, reverse, std::nullopt);
    const at::Tensor grad_a = stepped(z, dim, reverse, zeros, /*later=*/false) * g;
    at::Tensor grad_h, grad_h0;
    if (u.defined()) {
      grad_h = stepped(u * g, dim, reverse, zeros, /*later=*/true);
      if (h0.defined()) grad_h0 = h0_grad(u, g, h0, dim, reverse);
    }
    return {z, grad_a, grad_h, grad_h0, at::Tensor(), at::Tensor()};
  }
};

constexpr char kLinearScan[] = "baracuda::linear_scan";
constexpr char kLinearScanBackward[] = "baracuda::linear_scan_backward";

at::Tensor linear_scan(const at::Tensor& a, const at::Tensor& b, int64_t dim, bool reverse,
                       const std::optional<at::Tensor>& h0) {
  refuse_tangents(kLinearScan, a, b, h0);
  if (!needs_graph(a) && !needs_graph(b) && !needs_graph(h0)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return linear_scan_op().call(a, b, dim, reverse, h0);
  }
  return LinearScan::apply(a, b, h0, dim, reverse);
}

std::tuple<at::Tensor, at::Tensor> linear_scan_backward(const at::Tensor& grad,
                                                        const at::Tensor& a, const at::Tensor& h,
                                                        const std::optional<at::Tensor>& h0,
                                                        int64_t dim, bool reverse) {
  refuse_tangents(kLinearScanBackward, grad, a, h, h0);
  if (!needs_graph(grad) && !needs_graph(a) && !needs_graph(h) && !needs_graph(h0)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return linear_scan_backward_op().call(grad, a, h, h0, dim, reverse);
  }
  const variable_list out =
      LinearScanBackward::apply(grad, a, h, h0, dim, reverse);
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("linear_scan", &linear_scan);
  m.impl("linear_scan_backward", &linear_scan_backward);
}

}  // namespace baracuda
