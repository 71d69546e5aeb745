// Op layer of the attention-state merge family: validation, layouts, dispatch.
//
//   merge_state(v_a, s_a, v_b, s_b, lse_base)            -> (v, s)
//   merge_state_(v, s, v_other, s_other, lse_base)        in place on v, s
//   merge_states(v, s, lse_base)                          -> (v, s), n axis collapsed
//   merge_state_backward / merge_states_backward          gradients of the above
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <tuple>

#include "common/torch_glue.h"
#include "merge/merge_kernels.h"

namespace baracuda {
namespace {

double log2_scale_of(const char* op, c10::string_view base) {
  if (base == "2") return 1.0;
  if (base == "e") return 1.0 / std::log(2.0);
  TORCH_CHECK(false, "baracuda::", op, ": lse_base='", std::string(base),
              "' must be '2' (base-2 LSE, FlashInfer's convention) or 'e' (natural log, "
              "as SDPA, FlexAttention and FlashAttention return it)");
  return 0.0;
}

at::ScalarType lse_dtype_for(at::ScalarType v) {
  return v == at::kDouble ? at::kDouble : at::kFloat;
}

// v: [..., heads, dim] (with the stack axis before heads for merge_states);
// s: v's shape without the last axis.
void check_state(const char* op, const char* v_name, const at::Tensor& v, const char* s_name,
                 const at::Tensor& s, const at::Tensor& ref_v, int min_rank) {
  TORCH_CHECK(v.layout() == at::kStrided && s.layout() == at::kStrided, "baracuda::", op,
              ": ", v_name, " and ", s_name, " must be strided tensors");
  TORCH_CHECK(v.dim() >= min_rank && v.dim() <= kMaxRank, "baracuda::", op, ": ", v_name,
              ".dim()=", v.dim(), " must be in [", min_rank, ", ", kMaxRank, "]");
  TORCH_CHECK(v.sizes() == ref_v.sizes(), "baracuda::", op, ": ", v_name, ".shape=",
              v.sizes(), " must equal ", ref_v.sizes());
  TORCH_CHECK(v.scalar_type() == ref_v.scalar_type(), "baracuda::", op, ": ", v_name,
              ".dtype=", v.scalar_type(), " must equal ", ref_v.scalar_type());
  float_dtype_of(op, v_name, v);
  TORCH_CHECK(s.sizes() == v.sizes().slice(0, v.dim() - 1), "baracuda::", op, ": ", s_name,
              ".shape=", s.sizes(), " must be ", v_name, ".shape[:-1]=",
              v.sizes().slice(0, v.dim() - 1));
  TORCH_CHECK(s.scalar_type() == lse_dtype_for(v.scalar_type()), "baracuda::", op, ": ",
              s_name, ".dtype=", s.scalar_type(), " must be ", lse_dtype_for(v.scalar_type()),
              " for ", v.scalar_type(), " states");
  TORCH_CHECK(v.device() == ref_v.device() && s.device() == ref_v.device(), "baracuda::", op,
              ": ", v_name, " and ", s_name, " must be on ", ref_v.device(), ", got ",
              v.device(), " and ", s.device());
}

// Strides of `t` over its cell axes: every axis except `skip_a` / `skip_b`
// (negative: none), outermost first.
void cell_strides(int64_t (&out)[kMaxRank], const at::Tensor& t, int64_t skip_a,
                  int64_t skip_b = -1) {
  int r = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d == skip_a || d == skip_b) continue;
    out[r++] = t.stride(d);
  }
}

void cell_grid(CellGrid& g, const at::Tensor& s, int64_t skip) {
  g.rank = 0;
  for (int64_t d = 0; d < s.dim(); ++d) {
    if (d == skip) continue;
    g.sizes[g.rank++] = s.size(d);
  }
}

at::Tensor new_like(const at::Tensor& t, at::IntArrayRef sizes, at::ScalarType dtype) {
  return new_empty(sizes, t.options().dtype(dtype));
}

// The host kernels take float32/float64: half types are computed in float32.
at::Tensor host_compute(const at::Tensor& t) {
  const bool half = t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
  return half ? t.to(at::kFloat) : t;
}

// Pair form: states (v0, s0), (v1, s1) -> (vo, so). All of one shape family.
MergeForwardArgs pair_forward_args(const at::Tensor& v0, const at::Tensor& s0,
                                   const at::Tensor& v1, const at::Tensor& s1,
                                   const at::Tensor& vo, const at::Tensor& so, double k) {
  MergeForwardArgs a;
  a.dtype = float_dtype_of("merge_state", "v", v0);
  a.num_states = 2;
  a.head_dim = v0.size(-1);
  a.v[0] = v0.const_data_ptr();
  a.v[1] = v1.const_data_ptr();
  a.s[0] = s0.const_data_ptr();
  a.s[1] = s1.const_data_ptr();
  a.v_out = vo.data_ptr();
  a.s_out = so.data_ptr();
  cell_grid(a.cells, s0, -1);
  const int64_t dv = v0.dim() - 1;
  cell_strides(a.cell_strides[kFwV0], v0, dv);
  cell_strides(a.cell_strides[kFwV1], v1, dv);
  cell_strides(a.cell_strides[kFwS0], s0, -1);
  cell_strides(a.cell_strides[kFwS1], s1, -1);
  cell_strides(a.cell_strides[kFwVOut], vo, dv);
  cell_strides(a.cell_strides[kFwSOut], so, -1);
  a.inner_strides[kFwV0] = v0.stride(-1);
  a.inner_strides[kFwV1] = v1.stride(-1);
  a.inner_strides[kFwVOut] = vo.stride(-1);
  a.log2_scale = k;
  return a;
}

// Stack form: v [..., n, H, D], s [..., n, H] -> vo [..., H, D], so [..., H].
MergeForwardArgs stack_forward_args(const at::Tensor& v, const at::Tensor& s,
                                    const at::Tensor& vo, const at::Tensor& so, double k) {
  MergeForwardArgs a;
  a.dtype = float_dtype_of("merge_states", "v", v);
  a.stacked = true;
  const int64_t n_axis_s = s.dim() - 2, n_axis_v = v.dim() - 3;
  a.num_states = s.size(n_axis_s);
  a.head_dim = v.size(-1);
  a.v[0] = v.const_data_ptr();
  a.s[0] = s.const_data_ptr();
  a.v_state_stride = v.stride(n_axis_v);
  a.s_state_stride = s.stride(n_axis_s);
  a.v_out = vo.data_ptr();
  a.s_out = so.data_ptr();
  cell_grid(a.cells, s, n_axis_s);
  cell_strides(a.cell_strides[kFwV0], v, n_axis_v, v.dim() - 1);
  cell_strides(a.cell_strides[kFwS0], s, n_axis_s);
  cell_strides(a.cell_strides[kFwVOut], vo, vo.dim() - 1);
  cell_strides(a.cell_strides[kFwSOut], so, -1);
  a.inner_strides[kFwV0] = v.stride(-1);
  a.inner_strides[kFwVOut] = vo.stride(-1);
  a.log2_scale = k;
  return a;
}

void run_forward(const char* op, const MergeForwardArgs& a, const at::Tensor& device_ref) {
  run_on_device<MergeForwardArgs>(op, "merge", a, device_ref, &merge_forward_cpu, BARACUDA_CUDA_ONLY(&merge_forward_cuda));
}

void run_backward(const char* op, const MergeBackwardArgs& a, const at::Tensor& device_ref) {
  run_on_device<MergeBackwardArgs>(op, "merge backward", a, device_ref, &merge_backward_cpu,
            BARACUDA_CUDA_ONLY(&merge_backward_cuda));
}

bool needs_host_upcast(const at::Tensor& v) {
  return v.is_cpu() && (v.scalar_type() == at::kHalf || v.scalar_type() == at::kBFloat16);
}

// ------------------------------------------------------------------ forward ops

std::tuple<at::Tensor, at::Tensor> merge_state(const at::Tensor& v_a, const at::Tensor& s_a,
                                               const at::Tensor& v_b, const at::Tensor& s_b,
                                               c10::string_view lse_base) {
  const char* op = "merge_state";
  const double k = log2_scale_of(op, lse_base);
  check_state(op, "v_a", v_a, "s_a", s_a, v_a, 2);
  check_state(op, "v_b", v_b, "s_b", s_b, v_a, 2);
  at::Tensor vo = new_like(v_a, v_a.sizes(), v_a.scalar_type());
  at::Tensor so = new_like(s_a, s_a.sizes(), s_a.scalar_type());
  if (needs_host_upcast(v_a)) {
    const at::Tensor va = host_compute(v_a), vb = host_compute(v_b);
    at::Tensor vo_f = new_like(va, va.sizes(), va.scalar_type());
    MergeForwardArgs a = pair_forward_args(va, s_a, vb, s_b, vo_f, so, k);
    a.dtype = FloatDtype::kFloat32;
    run_forward(op, a, v_a);
    vo.copy_(vo_f);
  } else {
    run_forward(op, pair_forward_args(v_a, s_a, v_b, s_b, vo, so, k), v_a);
  }
  return {vo, so};
}

void check_disjoint(const char* op, std::initializer_list<std::pair<const char*, const at::Tensor*>> written,
                    std::initializer_list<std::pair<const char*, const at::Tensor*>> others) {
  for (const auto& w : written) {
    TORCH_CHECK(at::has_internal_overlap(*w.second) != at::MemOverlap::Yes, "baracuda::", op,
                ": ", w.first, " has internal overlap (e.g. an expanded tensor) and cannot "
                "be written in place");
    const StorageSpan ws = storage_span(w.second->storage_offset(), w.second->sizes(),
                                        w.second->strides());
    for (const auto& o : others) {
      if (o.second->numel() == 0 || w.second->numel() == 0) continue;
      if (o.second->is_same(*w.second)) continue;
      const StorageSpan os = storage_span(o.second->storage_offset(), o.second->sizes(),
                                          o.second->strides());
      TORCH_CHECK(!spans_intersect(*w.second, ws, *o.second, os), "baracuda::", op, ": ",
                  w.first, " shares memory with ", o.first,
                  "; in-place merging needs them disjoint (clone one first)");
    }
  }
}

void merge_state_(const at::Tensor& v, const at::Tensor& s, const at::Tensor& v_other,
                  const at::Tensor& s_other, c10::string_view lse_base) {
  const char* op = "merge_state_";
  const double k = log2_scale_of(op, lse_base);
  check_state(op, "v", v, "s", s, v, 2);
  check_state(op, "v_other", v_other, "s_other", s_other, v, 2);
  check_disjoint(op, {{"v", &v}, {"s", &s}},
                 {{"s", &s}, {"v_other", &v_other}, {"s_other", &s_other}});
  if (needs_host_upcast(v)) {
    const at::Tensor vf = host_compute(v), vof = host_compute(v_other);
    run_forward(op, [&] {
      MergeForwardArgs a = pair_forward_args(vf, s, vof, s_other, vf, s, k);
      a.dtype = FloatDtype::kFloat32;
      return a;
    }(), v);
    v.copy_(vf);
    return;
  }
  // Outputs alias state 0: every cell's inputs are read before its outputs
  // are written, by the threads that write them.
  run_forward(op, pair_forward_args(v, s, v_other, s_other, v, s, k), v);
}

std::tuple<at::Tensor, at::Tensor> merge_states(const at::Tensor& v, const at::Tensor& s,
                                                c10::string_view lse_base) {
  const char* op = "merge_states";
  const double k = log2_scale_of(op, lse_base);
  check_state(op, "v", v, "s", s, v, 3);
  std::vector<int64_t> v_shape(v.sizes().begin(), v.sizes().end());
  v_shape.erase(v_shape.end() - 3);
  std::vector<int64_t> s_shape(s.sizes().begin(), s.sizes().end());
  s_shape.erase(s_shape.end() - 2);
  at::Tensor vo = new_like(v, v_shape, v.scalar_type());
  at::Tensor so = new_like(s, s_shape, s.scalar_type());
  if (needs_host_upcast(v)) {
    const at::Tensor vf = host_compute(v);
    at::Tensor vo_f = new_like(vf, v_shape, vf.scalar_type());
    MergeForwardArgs a = stack_forward_args(vf, s, vo_f, so, k);
    a.dtype = FloatDtype::kFloat32;
    run_forward(op, a, v);
    vo.copy_(vo_f);
  } else {
    run_forward(op, stack_forward_args(v, s, vo, so, k), v);
  }
  return {vo, so};
}

// ------------------------------------------------------------------ backward ops

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> merge_state_backward(
    const at::Tensor& grad_v_in, const c10::optional<at::Tensor>& grad_s_in,
    const at::Tensor& v_a_in, const at::Tensor& s_a, const at::Tensor& v_b_in,
    const at::Tensor& s_b, c10::string_view lse_base) {
  const char* op = "merge_state_backward";
  const double k = log2_scale_of(op, lse_base);
  check_state(op, "v_a", v_a_in, "s_a", s_a, v_a_in, 2);
  check_state(op, "v_b", v_b_in, "s_b", s_b, v_a_in, 2);
  check_state(op, "grad_v", grad_v_in, "s_a", s_a, v_a_in, 2);
  if (grad_s_in.has_value() && grad_s_in->defined()) {
    check_state(op, "grad_v", grad_v_in, "grad_s", *grad_s_in, v_a_in, 2);
  }
  const bool up = needs_host_upcast(v_a_in);
  const at::Tensor grad_v = up ? host_compute(grad_v_in) : grad_v_in;
  const at::Tensor v_a = up ? host_compute(v_a_in) : v_a_in;
  const at::Tensor v_b = up ? host_compute(v_b_in) : v_b_in;
  at::Tensor gva = new_like(v_a, v_a.sizes(), v_a.scalar_type());
  at::Tensor gvb = new_like(v_a, v_a.sizes(), v_a.scalar_type());
  at::Tensor gsa = new_like(s_a, s_a.sizes(), s_a.scalar_type());
  at::Tensor gsb = new_like(s_a, s_a.sizes(), s_a.scalar_type());

  MergeBackwardArgs a;
  a.dtype = float_dtype_of(op, "v", v_a);
  a.num_states = 2;
  a.head_dim = v_a.size(-1);
  a.grad_v = grad_v.const_data_ptr();
  const bool has_gs = grad_s_in.has_value() && grad_s_in->defined();
  a.grad_s = has_gs ? grad_s_in->const_data_ptr() : nullptr;
  a.v[0] = v_a.const_data_ptr();
  a.v[1] = v_b.const_data_ptr();
  a.s[0] = s_a.const_data_ptr();
  a.s[1] = s_b.const_data_ptr();
  a.grad_vin[0] = gva.data_ptr();
  a.grad_vin[1] = gvb.data_ptr();
  a.grad_sin[0] = gsa.data_ptr();
  a.grad_sin[1] = gsb.data_ptr();
  cell_grid(a.cells, s_a, -1);
  const int64_t dv = v_a.dim() - 1;
  cell_strides(a.cell_strides[kBwGradV], grad_v, dv);
  if (has_gs) cell_strides(a.cell_strides[kBwGradS], *grad_s_in, -1);
  cell_strides(a.cell_strides[kBwV0], v_a, dv);
  cell_strides(a.cell_strides[kBwV1], v_b, dv);
  cell_strides(a.cell_strides[kBwS0], s_a, -1);
  cell_strides(a.cell_strides[kBwS1], s_b, -1);
  cell_strides(a.cell_strides[kBwGradV0], gva, dv);
  cell_strides(a.cell_strides[kBwGradV1], gvb, dv);
  cell_strides(a.cell_strides[kBwGradS0], gsa, -1);
  cell_strides(a.cell_strides[kBwGradS1], gsb, -1);
  a.inner_strides[kBwGradV] = grad_v.stride(-1);
  a.inner_strides[kBwV0] = v_a.stride(-1);
  a.inner_strides[kBwV1] = v_b.stride(-1);
  a.inner_strides[kBwGradV0] = gva.stride(-1);
  a.inner_strides[kBwGradV1] = gvb.stride(-1);
  a.log2_scale = k;
  run_backward(op, a, v_a_in);
  if (up) {
    return {gva.to(v_a_in.scalar_type()), gsa, gvb.to(v_a_in.scalar_type()), gsb};
  }
  return {gva, gsa, gvb, gsb};
}

std::tuple<at::Tensor, at::Tensor> merge_states_backward(
    const at::Tensor& grad_v_in, const c10::optional<at::Tensor>& grad_s_in,
    const at::Tensor& v_in, const at::Tensor& s, c10::string_view lse_base) {
  const char* op = "merge_states_backward";
  const double k = log2_scale_of(op, lse_base);
  check_state(op, "v", v_in, "s", s, v_in, 3);
  const int64_t n_axis_v = v_in.dim() - 3, n_axis_s = s.dim() - 2;
  std::vector<int64_t> out_shape(v_in.sizes().begin(), v_in.sizes().end());
  out_shape.erase(out_shape.begin() + n_axis_v);
  TORCH_CHECK(grad_v_in.sizes() == at::IntArrayRef(out_shape), "baracuda::", op,
              ": grad_v.shape=", grad_v_in.sizes(), " must be ", at::IntArrayRef(out_shape));
  TORCH_CHECK(grad_v_in.scalar_type() == v_in.scalar_type() &&
                  grad_v_in.device() == v_in.device(),
              "baracuda::", op, ": grad_v must match v's dtype and device");
  const bool has_gs = grad_s_in.has_value() && grad_s_in->defined();
  if (has_gs) {
    TORCH_CHECK(grad_s_in->sizes() == at::IntArrayRef(out_shape).slice(0, out_shape.size() - 1) &&
                    grad_s_in->scalar_type() == s.scalar_type() &&
                    grad_s_in->device() == s.device(),
                "baracuda::", op, ": grad_s must have shape ",
                at::IntArrayRef(out_shape).slice(0, out_shape.size() - 1), ", dtype ",
                s.scalar_type(), " and device ", s.device());
  }
  const bool up = needs_host_upcast(v_in);
  const at::Tensor grad_v = up ? host_compute(grad_v_in) : grad_v_in;
  const at::Tensor v = up ? host_compute(v_in) : v_in;
  at::Tensor gv = new_like(v, v.sizes(), v.scalar_type());
  at::Tensor gs = new_like(s, s.sizes(), s.scalar_type());

  MergeBackwardArgs a;
  a.dtype = float_dtype_of(op, "v", v);
  a.stacked = true;
  a.num_states = s.size(n_axis_s);
  a.head_dim = v.size(-1);
  a.grad_v = grad_v.const_data_ptr();
  a.grad_s = has_gs ? grad_s_in->const_data_ptr() : nullptr;
  a.v[0] = v.const_data_ptr();
  a.s[0] = s.const_data_ptr();
  a.v_state_stride = v.stride(n_axis_v);
  a.s_state_stride = s.stride(n_axis_s);
  a.grad_vin[0] = gv.data_ptr();
  a.grad_sin[0] = gs.data_ptr();
  a.grad_v_state_stride = gv.stride(n_axis_v);
  a.grad_s_state_stride = gs.stride(n_axis_s);
  cell_grid(a.cells, s, n_axis_s);
  cell_strides(a.cell_strides[kBwGradV], grad_v, grad_v.dim() - 1);
  if (has_gs) cell_strides(a.cell_strides[kBwGradS], *grad_s_in, -1);
  cell_strides(a.cell_strides[kBwV0], v, n_axis_v, v.dim() - 1);
  cell_strides(a.cell_strides[kBwS0], s, n_axis_s);
  cell_strides(a.cell_strides[kBwGradV0], gv, n_axis_v, gv.dim() - 1);
  cell_strides(a.cell_strides[kBwGradS0], gs, n_axis_s);
  a.inner_strides[kBwGradV] = grad_v.stride(-1);
  a.inner_strides[kBwV0] = v.stride(-1);
  a.inner_strides[kBwGradV0] = gv.stride(-1);
  a.log2_scale = k;
  run_backward(op, a, v_in);
  if (up) return {gv.to(v_in.scalar_type()), gs};
  return {gv, gs};
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("merge_state", &merge_state);
  m.impl("merge_state_", &merge_state_);
  m.impl("merge_states", &merge_states);
  m.impl("merge_state_backward", &merge_state_backward);
  m.impl("merge_states_backward", &merge_states_backward);
}

#ifdef BARACUDA_WITH_CUDA
TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("merge_state", &merge_state);
  m.impl("merge_state_", &merge_state_);
  m.impl("merge_states", &merge_states);
  m.impl("merge_state_backward", &merge_state_backward);
  m.impl("merge_states_backward", &merge_states_backward);
}
#endif

}  // namespace baracuda
