// Op layer of linear_scan, the recurrence h_t = a_t h_{t-1} + b_t along one
// axis, on the scan engine (ScanKind::kLinear):
//
//   linear_scan(a, b, dim, reverse, h0?)               -> h
//   linear_scan_backward(grad, a, h, h0?, dim, reverse) -> (da, db)
//
// h0 is the state before the first step (h_{-1}; zero when absent), of a's
// shape without dim or broadcastable to it. The engine's recurrence starts
// from zero, so a given h0 is folded into b's first position,
// b_0 + a_0 h0 (in a copy of b; float32 arithmetic for the half types,
// rounded to their dtype once), and in the backward h0's term of da's first
// position, db_0 h0, is written after the scan. h0's own gradient is
// a_0 db_0, which autograd forms (baracuda_torch/linear_scan.py).
#include <ATen/ExpandUtils.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/mul.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "common/torch_glue.h"
#include "scan/scan_kernels.h"
#include "scan/scan_op_support.h"

namespace baracuda {
namespace {

using namespace scan_op;

// `t` has ref's shape, dtype and device.
void check_like(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                const at::Tensor& ref) {
  TORCH_CHECK(t.layout() == at::kStrided, "baracuda::", op, ": ", name,
              " must be a strided tensor");
  TORCH_CHECK(t.sizes() == ref.sizes(), "baracuda::", op, ": ", name, ".shape=", t.sizes(),
              " must equal ", ref_name, ".shape=", ref.sizes());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "baracuda::", op, ": ", name, ".dtype=",
              t.scalar_type(), " must equal ", ref_name, ".dtype=", ref.scalar_type());
  TORCH_CHECK(t.device() == ref.device(), "baracuda::", op, ": ", name, " is on ", t.device(),
              " but ", ref_name, " is on ", ref.device());
}

// The type the h0 terms are formed in.
at::ScalarType term_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// h0 checked and expanded to `like`'s shape without axis d: a float tensor on
// like's device that broadcasts to that shape.
at::Tensor expanded_h0(const char* op, const at::Tensor& h0, const at::Tensor& like, int64_t d) {
  TORCH_CHECK(h0.layout() == at::kStrided, "baracuda::", op, ": h0 must be a strided tensor");
  TORCH_CHECK(h0.device() == like.device(), "baracuda::", op, ": h0 is on ", h0.device(),
              " but a is on ", like.device());
  float_dtype_of(op, "h0", h0);
  std::vector<int64_t> state(like.sizes().begin(), like.sizes().end());
  if (!state.empty()) state.erase(state.begin() + d);
  const bool fits = h0.dim() <= static_cast<int64_t>(state.size()) &&
                    at::is_expandable_to(h0.sizes(), state);
  TORCH_CHECK(fits, "baracuda::", op, ": h0.shape=", h0.sizes(),
              " must broadcast to the state's shape ", at::IntArrayRef(state),
              " (a's shape without dim)");
  return h0.expand(state);
}

at::Tensor linear_scan(const at::Tensor& a, const at::Tensor& b, int64_t dim, bool reverse,
                       const std::optional<at::Tensor>& h0) {
  const char* op = "linear_scan";
  const ScanShape s = scan_shape(op, a, dim);
  float_dtype_of(op, "a", a);
  check_like(op, "b", b, "a", a);
  const int64_t d = scan_axis(a, dim);
  const at::Tensor h0e = h0.has_value() ? expanded_h0(op, *h0, a, d) : at::Tensor();
  at::Tensor h = new_empty(a.sizes(), a.options());
  if (s.numel() == 0) return h;
  const at::Tensor ac = host_compute(a);
  at::Tensor bc = host_compute(b);
  if (h0e.defined()) {
    // b_0 + a_0 h0 in b's first position, in a copy of b.
    if (bc.is_alias_of(b)) bc = bc.clone();
    at::Tensor first = first_slice(bc, dim, reverse);
    const at::ScalarType t = term_type(a.scalar_type());
    first.copy_(at::addcmul(first.to(t), first_slice(ac, dim, reverse).to(t), h0e.to(t)));
  }
  const bool up = needs_host_upcast(a);
  at::Tensor hc = up ? new_empty(a.sizes(), ac.options()) : h;
  WorkspaceOwner ws{a.options()};
  ScanForwardArgs args = launch_args<ScanForwardArgs>(ScanKind::kLinear, op, ac, s, reverse, ws);
  args.x = ac.const_data_ptr();
  args.b = bc.const_data_ptr();
  args.y = hc.data_ptr();
  run_on_device<ScanForwardArgs>(op, "scan", args, a, &scan_forward_host,
                                 BARACUDA_CUDA_ONLY(&scan_forward_cuda));
  if (up) h.copy_(hc);
  return h;
}

std::tuple<at::Tensor, at::Tensor> linear_scan_backward(const at::Tensor& grad,
                                                        const at::Tensor& a, const at::Tensor& h,
                                                        const std::optional<at::Tensor>& h0,
                                                        int64_t dim, bool reverse) {
  const char* op = "linear_scan_backward";
  const ScanShape s = scan_shape(op, grad, dim);
  float_dtype_of(op, "grad", grad);
  check_like(op, "a", a, "grad", grad);
  check_like(op, "h", h, "grad", grad);
  const int64_t d = scan_axis(grad, dim);
  const at::Tensor h0e = h0.has_value() ? expanded_h0(op, *h0, grad, d) : at::Tensor();
  at::Tensor da = new_empty(grad.sizes(), grad.options());
  at::Tensor db = new_empty(grad.sizes(), grad.options());
  if (s.numel() == 0) return {da, db};
  const bool up = needs_host_upcast(grad);
  const at::Tensor gc = host_compute(grad);
  const at::Tensor ac = host_compute(a);
  const at::Tensor hc = host_compute(h);
  at::Tensor dac = up ? new_empty(grad.sizes(), gc.options()) : da;
  at::Tensor dbc = up ? new_empty(grad.sizes(), gc.options()) : db;
  WorkspaceOwner ws{grad.options()};
  ScanBackwardArgs args =
      launch_args<ScanBackwardArgs>(ScanKind::kLinear, op, gc, s, reverse, ws);
  args.dy = gc.const_data_ptr();
  args.x = ac.const_data_ptr();
  args.y = hc.const_data_ptr();
  args.dx = dac.data_ptr();
  args.db = dbc.data_ptr();
  run_on_device<ScanBackwardArgs>(op, "scan backward", args, grad, &scan_backward_host,
                                  BARACUDA_CUDA_ONLY(&scan_backward_cuda));
  if (h0e.defined()) {
    // da_0 = db_0 h0: the scan took h_{-1} as zero.
    const at::ScalarType t = term_type(grad.scalar_type());
    const at::Tensor term = at::mul(first_slice(dbc, dim, reverse).to(t), h0e.to(t));
    first_slice(dac, dim, reverse).copy_(term);
  }
  if (up) {
    da.copy_(dac);
    db.copy_(dbc);
  }
  return {da, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("linear_scan", &linear_scan);
  m.impl("linear_scan_backward", &linear_scan_backward);
}

#ifdef BARACUDA_WITH_CUDA
TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("linear_scan", &linear_scan);
  m.impl("linear_scan_backward", &linear_scan_backward);
}
#endif

}  // namespace baracuda
