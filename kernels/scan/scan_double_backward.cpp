// The vector-Jacobian product of scan_backward (what double backward needs),
// for every kind, written with differentiable ops -- ours through the
// dispatcher and torch's -- in O(n) memory, so that it is itself
// differentiable. Called by scan_backward's autograd node
// (scan_autograd.cpp).
#include "scan/scan_double_backward.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include <optional>

#include "scan/scan_op_handles.h"

namespace baracuda {
namespace {

at::Tensor baracuda_cumsum(const at::Tensor& x, int64_t dim, bool reverse) {
  static const auto op = find_op<DtypeScanFn>("baracuda::cumsum");
  return op.call(x, dim, reverse, std::nullopt);
}

at::Tensor baracuda_logcumsumexp(const at::Tensor& x, int64_t dim, bool reverse) {
  static const auto op = find_op<ValueScanFn>("baracuda::logcumsumexp");
  return op.call(x, dim, reverse);
}

at::Tensor cumprod_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& y,
                            int64_t dim, bool reverse) {
  return scan_backward_op(grad, x, y, at::Tensor(), dim, "cumprod", reverse);
}

// `t` moved `step` (+1 or -1) places along `dim`; the vacated end is `fill`.
at::Tensor shift(const at::Tensor& t, int64_t dim, int step, double fill) {
  const int64_t n = t.size(dim);
  if (n == 0) return t;
  const at::Tensor edge = at::full_like(t.narrow(dim, 0, 1), fill);
  if (step > 0) return at::cat({edge, t.narrow(dim, 0, n - 1)}, dim);
  return at::cat({t.narrow(dim, 1, n - 1), edge}, dim);
}

// Forward-direction cumprod backward dx_i = y_{i-1} R_i with
// R_i = sum_{j>=i} dy_j prod_{i<k<=j} x_k; its VJP against (dy, x, y) is
//
//   T_j = sum_{i<=j} gg_i y_{i-1} prod_{i<k<=j} x_k      -> d dy = T
//   d x_k = R_k T_{k-1},   d y_m = gg_{m+1} R_{m+1}
//
// R is the backward itself with y = 1; T is the reverse-direction backward
// applied to x shifted by one place (its products then span i<k<=j).
ScanBackwardVjp cumprod_vjp_forward(const at::Tensor& gg, const at::Tensor& dy,
                                    const at::Tensor& x, const at::Tensor& y, int64_t dim) {
  const at::Tensor ones = at::ones_like(x);
  const at::Tensor r = cumprod_backward(dy, x, ones, dim, false);
  const at::Tensor t =
      cumprod_backward(gg * shift(y, dim, +1, 1.0), shift(x, dim, -1, 1.0), ones, dim, true);
  return {t, r * shift(t, dim, +1, 0.0), shift(gg * r, dim, -1, 0.0)};
}

// 0-d tensors scan as length 1; reverse is the mirror image of the forward
// direction.
ScanBackwardVjp cumprod_vjp(const at::Tensor& gg, const at::Tensor& dy, const at::Tensor& x,
                            const at::Tensor& y, int64_t dim, bool reverse) {
  const bool scalar = gg.dim() == 0;
  const auto in = [&](const at::Tensor& t) {
    const at::Tensor v = scalar ? t.reshape({1}) : t;
    return reverse ? v.flip({dim}) : v;
  };
  const auto out = [&](const at::Tensor& t) {
    const at::Tensor v = reverse ? t.flip({dim}) : t;
    return scalar ? v.reshape({}) : v;
  };
  const ScanBackwardVjp v = cumprod_vjp_forward(in(gg), in(dy), in(x), in(y), dim);
  return {out(v.grad), out(v.x), out(v.y)};
}

// dx_i = sum_{j>=i} dy_j exp(x_i - y_j) (forward direction), so
// d dy_j = exp(-y_j) sum_{i<=j} gg_i exp(x_i), taken as two logcumsumexp
// streams split by the sign of gg; d x_i = gg_i dx_i; d y_j = -dy_j d dy_j.
// Where y_j is -inf (an all -inf prefix) every term is 0.
ScanBackwardVjp logcumsumexp_vjp(const at::Tensor& gg, const at::Tensor& dy,
                                 const at::Tensor& x, const at::Tensor& y, const at::Tensor& dx,
                                 int64_t dim, bool reverse) {
  const at::Tensor pos = baracuda_logcumsumexp(x + gg.clamp_min(0).log(), dim, reverse);
  const at::Tensor neg = baracuda_logcumsumexp(x + (-gg).clamp_min(0).log(), dim, reverse);
  const at::Tensor dead = y.isneginf();
  const at::Tensor zeros = at::zeros_like(y);
  const at::Tensor y_safe = at::where(dead, zeros, y);
  const at::Tensor g_dy = at::where(dead, zeros, (pos - y_safe).exp() - (neg - y_safe).exp());
  return {g_dy, gg * dx, -dy * g_dy};
}

}  // namespace

at::Tensor scan_backward_op(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& y,
                            const at::Tensor& indices, int64_t dim, c10::string_view kind,
                            bool reverse) {
  static const auto op = find_op<ScanBackwardFn>("baracuda::scan_backward");
  const auto maybe = [](const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  };
  return op.call(grad, maybe(x), maybe(y), maybe(indices), dim, kind, reverse);
}

ScanBackwardVjp scan_backward_vjp(const at::Tensor& gg, const ScanBackwardSaved& s) {
  if (s.kind == "cumsum") return {baracuda_cumsum(gg, s.dim, s.reverse), {}, {}};
  if (s.kind == "cummax" || s.kind == "cummin") {
    return {gg.dim() == 0 ? gg : gg.gather(s.dim, s.indices), {}, {}};
  }
  if (s.kind == "logcumsumexp") {
    return logcumsumexp_vjp(gg, s.grad, s.x, s.y, s.dx, s.dim, s.reverse);
  }
  return cumprod_vjp(gg, s.grad, s.x, s.y, s.dim, s.reverse);
}

}  // namespace baracuda
