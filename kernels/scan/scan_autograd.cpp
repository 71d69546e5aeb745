// Autograd of the scans, in C++: the five forward ops and scan_backward. A
// Python autograd kernel (torch.library.register_autograd) runs Python on
// every call, grad or no grad, and cost a small scan more host time than the
// scan itself; here a call that needs no graph goes straight below autograd,
// and one that does records one node. The forward ops' backward is the
// scan_backward op; scan_backward's (double backward) is the vector-Jacobian
// product of scan_double_backward.cpp, itself differentiable.
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

#include "common/forward_ad.h"
#include "scan/scan_double_backward.h"
#include "scan/scan_op_handles.h"

namespace baracuda {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool needs_graph(const at::Tensor& x) { return c10::GradMode::is_enabled() && x.requires_grad(); }
bool needs_graph(const std::optional<at::Tensor>& x) { return x.has_value() && needs_graph(*x); }

// The kind scan_backward takes: the op's name without its namespace.
std::string kind_of(const char* op_name) { return op_name + sizeof("baracuda::") - 1; }

// The scan of x in x's own dtype.
at::Tensor call_scan(const c10::TypedOperatorHandle<ValueScanFn>& op, const at::Tensor& x,
                     int64_t dim, bool reverse) {
  return op.call(x, dim, reverse);
}
at::Tensor call_scan(const c10::TypedOperatorHandle<DtypeScanFn>& op, const at::Tensor& x,
                     int64_t dim, bool reverse) {
  return op.call(x, dim, reverse, std::nullopt);
}

// cumsum, cumprod, logcumsumexp: y = scan(x). cumprod and logcumsumexp's
// backward reads x and y; cumsum's reads neither. Fn: the op's signature
// (cumsum and cumprod take a dtype, here always x's own).
template <typename Fn>
struct ValueScan : public torch::autograd::Function<ValueScan<Fn>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, bool reverse,
                            const std::string& kind, const c10::TypedOperatorHandle<Fn>& op) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor y = call_scan(op, x, dim, reverse);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["reverse"] = reverse;
    ctx->saved_data["kind"] = kind;
    if (kind != "cumsum") ctx->save_for_backward({x, y});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::string kind = ctx->saved_data["kind"].toStringRef();
    at::Tensor x, y;
    if (kind != "cumsum") {
      const variable_list saved = ctx->get_saved_variables();
      x = saved[0];
      y = saved[1];
    }
    const at::Tensor dx = scan_backward_op(grads[0], x, y, at::Tensor(),
                                        ctx->saved_data["dim"].toInt(), kind,
                                        ctx->saved_data["reverse"].toBool());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// cummax, cummin: (values, indices); the backward reads the indices alone,
// which carry no gradient.
struct IndexedScan : public torch::autograd::Function<IndexedScan> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim,
                               bool reverse, const std::string& kind,
                               const c10::TypedOperatorHandle<IndexedScanFn>& op) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [values, indices] = op.call(x, dim, reverse);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["reverse"] = reverse;
    ctx->saved_data["kind"] = kind;
    ctx->save_for_backward({indices});
    ctx->mark_non_differentiable({indices});
    return {values, indices};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor indices = ctx->get_saved_variables()[0];
    // Where only the indices were used, autograd hands in zeros for the
    // values' gradient (grads are materialised), so grads[0] is defined.
    const at::Tensor dx = scan_backward_op(grads[0], at::Tensor(), at::Tensor(), indices,
                                        ctx->saved_data["dim"].toInt(),
                                        ctx->saved_data["kind"].toStringRef(),
                                        ctx->saved_data["reverse"].toBool());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// scan_backward(grad, x?, y?, indices?, ...) -> dx. What its backward reads
// is saved per kind (ScanBackwardSaved); indices carry no gradient.
struct ScanBackward : public torch::autograd::Function<ScanBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad,
                            const std::optional<at::Tensor>& x,
                            const std::optional<at::Tensor>& y,
                            const std::optional<at::Tensor>& indices, int64_t dim,
                            const std::string& kind, bool reverse,
                            const c10::TypedOperatorHandle<ScanBackwardFn>& op) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor dx = op.call(grad, x, y, indices, dim, kind, reverse);
    const int64_t rank = grad.dim();
    ctx->saved_data["dim"] = rank == 0 ? dim : (dim % rank + rank) % rank;
    ctx->saved_data["reverse"] = reverse;
    ctx->saved_data["kind"] = kind;
    const bool reads_xy = kind == "cumprod" || kind == "logcumsumexp";
    const auto keep = [](bool needed, const std::optional<at::Tensor>& t) {
      return needed && t.has_value() ? *t : at::Tensor();
    };
    ctx->save_for_backward({reads_xy ? grad : at::Tensor(), keep(reads_xy, x), keep(reads_xy, y),
                            keep(kind == "cummax" || kind == "cummin", indices),
                            kind == "logcumsumexp" ? dx : at::Tensor()});
    return dx;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    ScanBackwardSaved s;
    s.grad = saved[0];
    s.x = saved[1];
    s.y = saved[2];
    s.indices = saved[3];
    s.dx = saved[4];
    s.dim = ctx->saved_data["dim"].toInt();
    s.kind = ctx->saved_data["kind"].toStringRef();
    s.reverse = ctx->saved_data["reverse"].toBool();
    const ScanBackwardVjp v = scan_backward_vjp(grads[0], s);
    return {v.grad, v.x, v.y, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

template <const char* kName>
at::Tensor value_scan(const at::Tensor& x, int64_t dim, bool reverse) {
  static const auto op = find_op<ValueScanFn>(kName);
  refuse_tangents(kName, x);
  if (!needs_graph(x)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return op.call(x, dim, reverse);
  }
  return ValueScan<ValueScanFn>::apply(x, dim, reverse, kind_of(kName), op);
}

// cumsum, cumprod with a dtype: x is cast to it (a differentiable cast, for
// a float dtype) and scanned in it. An integer dtype has no gradient, and,
// as in torch, is refused for an x that requires grad rather than cutting
// the graph silently.
template <const char* kName>
at::Tensor dtype_scan(const at::Tensor& x, int64_t dim, bool reverse,
                      std::optional<at::ScalarType> dtype) {
  static const auto op = find_op<DtypeScanFn>(kName);
  refuse_tangents(kName, x);
  if (!needs_graph(x)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return op.call(x, dim, reverse, dtype);
  }
  if (!dtype.has_value() || *dtype == x.scalar_type()) {
    return ValueScan<DtypeScanFn>::apply(x, dim, reverse, kind_of(kName), op);
  }
  TORCH_CHECK(!at::isIntegralType(*dtype, /*includeBool=*/true), kName, ": dtype=", *dtype,
              " gives a result without gradient, but x requires grad; detach x or use a "
              "floating dtype");
  return ValueScan<DtypeScanFn>::apply(x.to(*dtype), dim, reverse, kind_of(kName), op);
}

template <const char* kName>
std::tuple<at::Tensor, at::Tensor> indexed_scan(const at::Tensor& x, int64_t dim, bool reverse) {
  static const auto op = find_op<IndexedScanFn>(kName);
  refuse_tangents(kName, x);
  if (!needs_graph(x)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return op.call(x, dim, reverse);
  }
  const variable_list out = IndexedScan::apply(x, dim, reverse, kind_of(kName), op);
  return {out[0], out[1]};
}

at::Tensor scan_backward(const at::Tensor& grad, const std::optional<at::Tensor>& x,
                         const std::optional<at::Tensor>& y,
                         const std::optional<at::Tensor>& indices, int64_t dim,
                         c10::string_view kind, bool reverse) {
  static const auto op = find_op<ScanBackwardFn>("baracuda::scan_backward");
  refuse_tangents("baracuda::scan_backward", grad, x, y);
  if (!needs_graph(grad) && !needs_graph(x) && !needs_graph(y)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return op.call(grad, x, y, indices, dim, kind, reverse);
  }
  return ScanBackward::apply(grad, x, y, indices, dim, std::string(kind), reverse, op);
}

constexpr char kCumsum[] = "baracuda::cumsum";
constexpr char kCumprod[] = "baracuda::cumprod";
constexpr char kLogcumsumexp[] = "baracuda::logcumsumexp";
constexpr char kCummax[] = "baracuda::cummax";
constexpr char kCummin[] = "baracuda::cummin";

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("cumsum", &dtype_scan<kCumsum>);
  m.impl("cumprod", &dtype_scan<kCumprod>);
  m.impl("logcumsumexp", &value_scan<kLogcumsumexp>);
  m.impl("cummax", &indexed_scan<kCummax>);
  m.impl("cummin", &indexed_scan<kCummin>);
  m.impl("scan_backward", &scan_backward);
}

}  // namespace baracuda
