// Op layer of the scan family: validation, the [outer, len, inner] view,
// workspace, dispatch.
//
//   cumsum / cumprod(x, dim, reverse, dtype?)          -> y
//   logcumsumexp(x, dim, reverse)                      -> y
//   cummax / cummin(x, dim, reverse)                  -> (values, indices)
//   scan_backward(grad, x?, y?, indices?, dim, kind, reverse) -> dx
//   scan_path(x, dim, kind?, backward, reverse, dtype?) which CUDA path (and, given
//                                                      the op, which kernel) a scan takes
//   _scan_standing_marks_left(like, marks_left)        brings the standing slots'
//                                                      marks near their wrap (tests)
//
// Inputs are made contiguous (a copy only when they are not); outputs are
// contiguous. Dtypes as torch's: cumsum / cumprod cast x to `dtype` first
// when one is given, and scan integer and bool x in int64 when not; cummax /
// cummin keep integer and bool dtypes; logcumsumexp takes float types only.
// Integer scans run on their own engine (scan_integer_kernels.h).
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "common/torch_glue.h"
#include "scan/scan_integer_kernels.h"
#include "scan/scan_kernels.h"
#include "scan/scan_op_support.h"
#include "scan/scan_plan.h"

namespace baracuda {
namespace {

using namespace scan_op;

const char* kind_name(ScanKind kind) {
  switch (kind) {
    case ScanKind::kCumsum: return "cumsum";
    case ScanKind::kCumprod: return "cumprod";
    case ScanKind::kLogcumsumexp: return "logcumsumexp";
    case ScanKind::kCummax: return "cummax";
    case ScanKind::kCummin: return "cummin";
    case ScanKind::kLinear: return "linear_scan";
  }
  return "?";
}

ScanKind parse_kind(const char* op, c10::string_view kind) {
  for (ScanKind k : {ScanKind::kCumsum, ScanKind::kCumprod, ScanKind::kLogcumsumexp,
                     ScanKind::kCummax, ScanKind::kCummin, ScanKind::kLinear}) {
    if (kind == kind_name(k)) return k;
  }
  TORCH_CHECK(false, "baracuda::", op, ": kind='", std::string(kind),
              "' must be one of cumsum, cumprod, logcumsumexp, cummax, cummin, linear_scan");
  return ScanKind::kCumsum;
}

KernelStatus scan_integer_host(const IntegerScanArgs& a) {
  return scan_on_host_threads(a, &scan_integer_cpu_lines);
}

// ------------------------------------------------------------------ forward

// The integer scans' element type for `t`, or nothing.
std::optional<IntegerDtype> integer_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool: return IntegerDtype::kBool;
    case at::kByte: return IntegerDtype::kUInt8;
    case at::kChar: return IntegerDtype::kInt8;
    case at::kShort: return IntegerDtype::kInt16;
    case at::kUInt16: return IntegerDtype::kUInt16;
    case at::kInt: return IntegerDtype::kInt32;
    case at::kUInt32: return IntegerDtype::kUInt32;
    case at::kLong: return IntegerDtype::kInt64;
    case at::kUInt64: return IntegerDtype::kUInt64;
    default: return std::nullopt;
  }
}

bool is_integer(at::ScalarType t) { return integer_dtype(t).has_value(); }

// What torch scans in: cumsum / cumprod in `dtype` when given (uint8, int8,
// int16, int32, int64 or a float type), else in int64 for integer and bool
// x; cummax / cummin in x's dtype, for bool, uint8, int8, int16, int32 and
// int64 as for float types. Float types are checked by the float path.
at::ScalarType scan_dtype(ScanKind kind, const at::Tensor& x,
                          std::optional<at::ScalarType> dtype) {
  const char* op = kind_name(kind);
  const bool arithmetic = kind == ScanKind::kCumsum || kind == ScanKind::kCumprod;
  if (dtype.has_value()) {
    const at::ScalarType d = *dtype;
    TORCH_CHECK(d == at::kByte || d == at::kChar || d == at::kShort || d == at::kInt ||
                    d == at::kLong || d == at::kHalf || d == at::kBFloat16 || d == at::kFloat ||
                    d == at::kDouble,
                "baracuda::", op, ": dtype=", d, " is not supported; use uint8, int8, int16, "
                "int32, int64, float16, bfloat16, float32 or float64");
    TORCH_CHECK(!x.is_complex(), "baracuda::", op, ": x.dtype=", x.scalar_type(),
                " is not supported");
    return d;
  }
  const at::ScalarType t = x.scalar_type();
  if (!is_integer(t) || kind == ScanKind::kLogcumsumexp || kind == ScanKind::kLinear) return t;
  if (arithmetic) return at::kLong;
  TORCH_CHECK(t != at::kUInt16 && t != at::kUInt32 && t != at::kUInt64, "baracuda::", op,
              ": x.dtype=", t, " is not supported; use bool, uint8, int8, int16, int32, "
              "int64, float16, bfloat16, float32 or float64");
  return t;
}

bool has_indices(ScanKind kind) { return kind == ScanKind::kCummax || kind == ScanKind::kCummin; }

// A forward's results for x: y of `dtype` and, for cummax / cummin, int64
// indices (undefined otherwise).
std::tuple<at::Tensor, at::Tensor> new_results(ScanKind kind, const at::Tensor& x,
                                               at::ScalarType dtype) {
  at::Tensor y = new_empty(x.sizes(), x.options().dtype(dtype));
  if (!has_indices(kind)) return {y, at::Tensor()};
  return {y, new_empty(x.sizes(), x.options().dtype(at::kLong))};
}

std::tuple<at::Tensor, at::Tensor> integer_forward(ScanKind kind, const at::Tensor& x,
                                                   const ScanShape& s, bool reverse,
                                                   at::ScalarType out) {
  auto [y, idx] = new_results(kind, x, out);
  if (s.numel() == 0) return {y, idx};
  // Float x with an integer dtype: torch casts first (toward zero).
  const at::Tensor xc = is_integer(x.scalar_type()) ? x.contiguous() : x.to(out).contiguous();
  IntegerScanArgs a;
  a.kind = kind;
  a.x_dtype = *integer_dtype(xc.scalar_type());
  a.y_dtype = *integer_dtype(out);
  a.shape = s;
  a.reverse = reverse;
  a.x = xc.const_data_ptr();
  a.y = y.data_ptr();
  a.indices = idx.defined() ? idx.data_ptr<int64_t>() : nullptr;
  run_on_device<IntegerScanArgs>(kind_name(kind), "scan", a, x, &scan_integer_host,
                                 BARACUDA_CUDA_ONLY(&scan_integer_cuda));
  return {y, idx};
}

std::tuple<at::Tensor, at::Tensor> forward(ScanKind kind, const at::Tensor& x_in, int64_t dim,
                                           bool reverse,
                                           std::optional<at::ScalarType> dtype = std::nullopt) {
  const char* op = kind_name(kind);
  const ScanShape s = scan_shape(op, x_in, dim);
  const at::ScalarType out = scan_dtype(kind, x_in, dtype);
  if (kind != ScanKind::kLogcumsumexp && is_integer(out)) {
    return integer_forward(kind, x_in, s, reverse, out);
  }
  const at::Tensor x = x_in.scalar_type() == out ? x_in : x_in.to(out);
  float_dtype_of(op, "x", x);
  auto [y, idx] = new_results(kind, x, out);
  if (s.numel() == 0) return {y, idx};
  const at::Tensor xc = host_compute(x);
  const bool up = needs_host_upcast(x);
  at::Tensor yc = up ? new_empty(x.sizes(), xc.options()) : y;
  WorkspaceOwner ws{x.options()};
  ScanForwardArgs a = launch_args<ScanForwardArgs>(kind, op, xc, s, reverse, ws);
  a.x = xc.const_data_ptr();
  a.y = yc.data_ptr();
  a.indices = idx.defined() ? idx.data_ptr<int64_t>() : nullptr;
  run_on_device<ScanForwardArgs>(op, "scan", a, x, &scan_forward_host, BARACUDA_CUDA_ONLY(&scan_forward_cuda));
  if (up) y.copy_(yc);
  return {y, idx};
}

at::Tensor cumsum(const at::Tensor& x, int64_t dim, bool reverse,
                  std::optional<at::ScalarType> dtype) {
  return std::get<0>(forward(ScanKind::kCumsum, x, dim, reverse, dtype));
}
at::Tensor cumprod(const at::Tensor& x, int64_t dim, bool reverse,
                   std::optional<at::ScalarType> dtype) {
  return std::get<0>(forward(ScanKind::kCumprod, x, dim, reverse, dtype));
}
at::Tensor logcumsumexp(const at::Tensor& x, int64_t dim, bool reverse) {
  return std::get<0>(forward(ScanKind::kLogcumsumexp, x, dim, reverse));
}
std::tuple<at::Tensor, at::Tensor> cummax(const at::Tensor& x, int64_t dim, bool reverse) {
  return forward(ScanKind::kCummax, x, dim, reverse);
}
std::tuple<at::Tensor, at::Tensor> cummin(const at::Tensor& x, int64_t dim, bool reverse) {
  return forward(ScanKind::kCummin, x, dim, reverse);
}

// ------------------------------------------------------------------ backward

const at::Tensor& saved(const char* op, ScanKind kind, const char* name,
                        const c10::optional<at::Tensor>& t, const at::Tensor& grad,
                        bool same_dtype) {
  TORCH_CHECK(t.has_value() && t->defined(), "baracuda::", op, ": kind='", kind_name(kind),
              "' needs the saved forward tensor ", name);
  TORCH_CHECK(t->sizes() == grad.sizes(), "baracuda::", op, ": ", name, ".shape=", t->sizes(),
              " must equal grad.shape=", grad.sizes());
  TORCH_CHECK(t->device() == grad.device(), "baracuda::", op, ": ", name, " is on ",
              t->device(), " but grad is on ", grad.device());
  if (same_dtype) {
    TORCH_CHECK(t->scalar_type() == grad.scalar_type(), "baracuda::", op, ": ", name,
                ".dtype=", t->scalar_type(), " must equal grad.dtype=", grad.scalar_type());
  } else {
    TORCH_CHECK(t->scalar_type() == at::kLong, "baracuda::", op, ": ", name,
                ".dtype=", t->scalar_type(), " must be int64");
  }
  return *t;
}

at::Tensor scan_backward(const at::Tensor& grad, const c10::optional<at::Tensor>& x,
                         const c10::optional<at::Tensor>& y,
                         const c10::optional<at::Tensor>& indices, int64_t dim,
                         c10::string_view kind_str, bool reverse) {
  const char* op = "scan_backward";
  const ScanKind kind = parse_kind(op, kind_str);
  TORCH_CHECK(kind != ScanKind::kLinear, "baracuda::", op,
              ": kind='linear_scan' has its own backward op, linear_scan_backward");
  const ScanShape s = scan_shape(op, grad, dim);
  float_dtype_of(op, "grad", grad);
  const bool uses_xy = kind == ScanKind::kCumprod || kind == ScanKind::kLogcumsumexp;
  const bool uses_idx = kind == ScanKind::kCummax || kind == ScanKind::kCummin;
  at::Tensor xs, ys, is;
  if (uses_xy) {
    xs = saved(op, kind, "x", x, grad, true);
    ys = saved(op, kind, "y", y, grad, true);
  }
  if (uses_idx) is = saved(op, kind, "indices", indices, grad, false).contiguous();
  at::Tensor dx = new_empty(grad.sizes(), grad.options());
  if (s.numel() == 0) return dx;
  const bool up = needs_host_upcast(grad);
  const at::Tensor gc = host_compute(grad);
  if (uses_xy) {
    xs = host_compute(xs);
    ys = host_compute(ys);
  }
  at::Tensor dxc = up ? new_empty(grad.sizes(), gc.options()) : dx;
  WorkspaceOwner ws{grad.options()};
  ScanBackwardArgs a = launch_args<ScanBackwardArgs>(kind, op, gc, s, reverse, ws);
  a.dy = gc.const_data_ptr();
  a.x = uses_xy ? xs.const_data_ptr() : nullptr;
  a.y = uses_xy ? ys.const_data_ptr() : nullptr;
  a.indices = uses_idx ? is.const_data_ptr<int64_t>() : nullptr;
  a.dx = dxc.data_ptr();
  run_on_device<ScanBackwardArgs>(op, "scan backward", a, grad, &scan_backward_host,
                             BARACUDA_CUDA_ONLY(&scan_backward_cuda));
  if (up) dx.copy_(dxc);
  return dx;
}

#ifdef BARACUDA_WITH_CUDA
// The kernel a CUDA scan would run, asked of the launcher's own choice on
// x's device (the current one for a meta x). Arrays the op allocates, or
// copies to make contiguous, are fresh allocations (256-byte aligned);
// x, where the op reads it as it is, has its own alignment, which the
// backward's inputs are taken to share.
std::string cuda_kernel_name(const at::Tensor& x, ScanKind kind, const ScanShape& s,
                             FloatDtype dtype, bool as_is, bool backward, bool reverse) {
  alignas(256) static char fresh_allocation;
  void* fresh = &fresh_allocation;
  const void* data = as_is ? x.const_data_ptr() : fresh;
  std::optional<c10::DeviceGuard> guard;
  if (x.is_cuda()) guard.emplace(x.device());
  const auto described = [&](auto a) {
    a.kind = kind;
    a.dtype = dtype;
    a.shape = s;
    a.reverse = reverse;
    return a;
  };
  if (!backward) {
    ScanForwardArgs a = described(ScanForwardArgs{});
    a.x = a.b = data;
    a.y = fresh;
    a.indices = static_cast<int64_t*>(fresh);
    return scan_kernel_name(scan_forward_kernel_cuda(a));
  }
  ScanBackwardArgs a = described(ScanBackwardArgs{});
  a.dy = a.x = a.y = data;
  a.indices = static_cast<const int64_t*>(fresh);
  a.dx = a.db = fresh;
  return scan_kernel_name(scan_backward_kernel_cuda(a));
}
#endif

// Without kind: the path of the shape plan, or "integer" where the scan is
// an integer one (integer or bool x, or an integer dtype=: the integer
// engine). With kind: the kernel that op runs, chosen by the launcher itself
// ("host" for a CPU x).
std::string scan_path(const at::Tensor& x, int64_t dim,
                      std::optional<c10::string_view> kind_str, bool backward, bool reverse,
                      std::optional<at::ScalarType> dtype) {
  const char* op = "scan_path";
  const ScanShape s = scan_shape(op, x, dim);
  if (!kind_str.has_value()) {
    TORCH_CHECK(!backward, "baracuda::scan_path: backward=True needs kind=");
    const bool integer = dtype.has_value() ? is_integer(*dtype) : is_integer(x.scalar_type());
    if (s.numel() > 0 && integer) return "integer";
    return scan_path_name(plan_scan(s).path);
  }
  const ScanKind kind = parse_kind(op, *kind_str);
  TORCH_CHECK(!dtype.has_value() || kind == ScanKind::kCumsum || kind == ScanKind::kCumprod,
              "baracuda::scan_path: dtype= is for cumsum and cumprod, not kind='",
              kind_name(kind), "'");
  const at::ScalarType out = scan_dtype(kind, x, dtype);
  const bool integer =
      kind != ScanKind::kLogcumsumexp && kind != ScanKind::kLinear && is_integer(out);
  TORCH_CHECK(!(backward && integer), "baracuda::scan_path: an integer scan has no backward");
  if (s.numel() == 0) return "empty";
  if (integer) return "integer";
  const FloatDtype fd = float_dtype_of(op, "x", out);
  if (x.is_cpu()) return "host";
#ifdef BARACUDA_WITH_CUDA
  TORCH_CHECK(x.is_cuda() || at::hasCUDA(), "baracuda::scan_path: kind= names a CUDA kernel, "
              "and x is on ", x.device(), " with no CUDA device present");
  const bool as_is = x.is_cuda() && x.scalar_type() == out && x.is_contiguous();
  return cuda_kernel_name(x, kind, s, fd, as_is, backward, reverse);
#else
  (void)fd, (void)reverse;
  TORCH_CHECK(false, "baracuda::scan_path: kind= names a CUDA kernel, and this build has no "
              "CUDA");
  return "";
#endif
}

#ifdef BARACUDA_WITH_CUDA
int64_t scan_standing_marks_left(const at::Tensor& like, int64_t marks_left) {
  TORCH_CHECK(marks_left >= 0 && marks_left < int64_t{0xffffffff},
              "baracuda::_scan_standing_marks_left: marks_left=", marks_left,
              " must be in [0, 2^32 - 2]");
  const c10::DeviceGuard guard(like.device());
  return scan_standing_marks_left_cuda(current_cuda_stream(like), marks_left);
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("cumsum", &cumsum);
  m.impl("cumprod", &cumprod);
  m.impl("logcumsumexp", &logcumsumexp);
  m.impl("cummax", &cummax);
  m.impl("cummin", &cummin);
  m.impl("scan_backward", &scan_backward);
}

#ifdef BARACUDA_WITH_CUDA
TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("cumsum", &cumsum);
  m.impl("cumprod", &cumprod);
  m.impl("logcumsumexp", &logcumsumexp);
  m.impl("cummax", &cummax);
  m.impl("cummin", &cummin);
  m.impl("scan_backward", &scan_backward);
  m.impl("_scan_standing_marks_left", &scan_standing_marks_left);
}
#endif

TORCH_LIBRARY_IMPL(baracuda, CompositeExplicitAutograd, m) {
  m.impl("scan_path", &scan_path);
}

}  // namespace baracuda
