// Autograd of the in-place writes, write_slice_ and write_slice_at_: each is
// differentiable as `dest[window].copy_(source)` is. The gradient reaching
// dest's history is the incoming one with the window zeroed (the old values
// there were overwritten), source's is the incoming gradient's window. dest
// takes the write as its new history (views too: autograd rebases them), its
// version counter is bumped so saved copies of it are checked, and a leaf
// that requires grad is refused before anything is written, as torch does.
//
// The out-of-place write_slice has the same gradients. All three are C++
// kernels at the Autograd key, as every family's autograd is
// (torch.library.register_autograd takes functional ops only), and the
// in-place ones bump the version at ADInplaceOrView, where torch's own
// in-place ops bump it.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <vector>

#include "common/forward_ad.h"
#include "common/op_handle.h"

namespace baracuda {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using WriteSliceFn = void(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, bool);
using WriteSliceAtFn = void(const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&, bool);

const c10::TypedOperatorHandle<WriteSliceFn>& write_slice_op() {
  static const auto op = find_op<WriteSliceFn>("baracuda::write_slice_");
  return op;
}

using WriteSliceCopyFn = at::Tensor(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef,
                                    bool);

const c10::TypedOperatorHandle<WriteSliceCopyFn>& write_slice_copy_op() {
  static const auto op = find_op<WriteSliceCopyFn>("baracuda::write_slice");
  return op;
}

const c10::TypedOperatorHandle<WriteSliceAtFn>& write_slice_at_op() {
  static const auto op = find_op<WriteSliceAtFn>("baracuda::write_slice_at_");
  return op;
}

// Whether this write joins the graph; if so, dest must be a tensor autograd
// lets be written in place (raises for a leaf that requires grad, a view of
// one, and the views torch refuses to rebase), checked before the write.
bool check_differentiable_write(const at::Tensor& dest, const at::Tensor& source) {
  const bool differentiable =
      c10::GradMode::is_enabled() && (dest.requires_grad() || source.requires_grad());
  torch::autograd::check_inplace(dest, differentiable);
  return differentiable;
}

// `t` narrowed to the window (start_0, end_0, start_1, end_1, ...).
at::Tensor window_of(const at::Tensor& t, const std::vector<c10::SymInt>& ranges) {
  at::Tensor w = t;
  for (int64_t d = 0; d < t.dim(); ++d) {
    w = w.narrow_symint(d, ranges[2 * d], ranges[2 * d + 1] - ranges[2 * d]);
  }
  return w;
}

// The gradients of a write of source into dest's window, in place or not:
// dest's is the incoming one with the window zeroed, source's its window.
variable_list window_write_grads(AutogradContext* ctx, const at::Tensor& grad) {
  const std::vector<c10::SymInt> ranges = ctx->saved_data["ranges"].toSymIntVector();
  at::Tensor grad_dest, grad_source;
  if (ctx->needs_input_grad(0)) {
    grad_dest = grad.clone();
    window_of(grad_dest, ranges).zero_();
  }
  if (ctx->needs_input_grad(1)) grad_source = window_of(grad, ranges);
  return {grad_dest, grad_source, at::Tensor(), at::Tensor()};
}

struct WriteSliceInPlace : public torch::autograd::Function<WriteSliceInPlace> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dest, const at::Tensor& source,
                            c10::SymIntArrayRef ranges, bool packed_int4) {
    at::AutoDispatchBelowAutograd below;
    write_slice_op().call(dest, source, ranges, packed_int4);
    ctx->saved_data["ranges"] = c10::IValue(ranges);
    ctx->mark_dirty({dest});
    return dest;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return window_write_grads(ctx, grads[0]);
  }
};

struct WriteSlice : public torch::autograd::Function<WriteSlice> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dest, const at::Tensor& source,
                            c10::SymIntArrayRef ranges, bool packed_int4) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->saved_data["ranges"] = c10::IValue(ranges);
    return write_slice_copy_op().call(dest, source, ranges, packed_int4);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return window_write_grads(ctx, grads[0]);
  }
};

// The window of `grad` that write_slice_at_ wrote from source, as a tensor of
// source's shape: positions offset + [0, length) along dim, the offset
// scalar or one per row of axis 0. Gathered on the device (no host sync);
// rows whose offset is out of range, which the CUDA write skips, get zeros.
at::Tensor window_at(const at::Tensor& grad, int64_t dim, const at::Tensor& offsets,
                     const c10::SymInt& length) {
  const int64_t rank = grad.dim();
  std::vector<int64_t> offset_shape(rank, 1);
  if (offsets.dim() == 1) offset_shape[0] = offsets.size(0);
  const at::Tensor offset = offsets.reshape(offset_shape);
  std::vector<int64_t> along_dim(rank, 1);
  along_dim[dim] = -1;
  const at::Tensor positions = at::arange(c10::Scalar(length), offsets.options()).view(along_dim);
  const c10::Scalar limit(grad.sym_size(dim) - length);
  const at::Tensor in_range = offset.ge(0).logical_and(offset.le(limit));
  std::vector<c10::SymInt> sizes = grad.sym_sizes().vec();
  sizes[dim] = length;
  const at::Tensor index = (offset.clamp(0, limit) + positions).expand_symint(sizes);
  return at::where(in_range, at::gather(grad, dim, index), 0);
}

struct WriteSliceAtInPlace : public torch::autograd::Function<WriteSliceAtInPlace> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dest, const at::Tensor& source,
                            int64_t dim, const at::Tensor& offsets, bool packed_int4) {
    at::AutoDispatchBelowAutograd below;
    write_slice_at_op().call(dest, source, dim, offsets, packed_int4);
    // The op has validated dim; keep it non-negative.
    const int64_t d = dim < 0 ? dim + dest.dim() : dim;
    ctx->saved_data["dim"] = d;
    ctx->saved_data["length"] = source.sym_size(d);
    ctx->save_for_backward({offsets});
    ctx->mark_dirty({dest});
    return dest;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor offsets = ctx->get_saved_variables()[0];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const c10::SymInt length = ctx->saved_data["length"].toSymInt();
    const at::Tensor& grad = grads[0];
    at::Tensor grad_dest, grad_source;
    if (ctx->needs_input_grad(0)) {
      // Zeros written where the forward wrote, by the op itself, so a row
      // the forward skipped keeps its gradient.
      std::vector<c10::SymInt> sizes = grad.sym_sizes().vec();
      sizes[dim] = length;
      grad_dest = grad.clone();
      write_slice_at_op().call(grad_dest, at::zeros_symint(sizes, grad.options()), dim, offsets,
                               false);
    }
    if (ctx->needs_input_grad(1)) grad_source = window_at(grad, dim, offsets, length);
    return {grad_dest, grad_source, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void write_slice_autograd(const at::Tensor& dest, const at::Tensor& source,
                          c10::SymIntArrayRef ranges, bool packed_int4) {
  refuse_tangents("baracuda::write_slice_", dest, source);
  if (!check_differentiable_write(dest, source)) {
    at::AutoDispatchBelowAutograd below;
    return write_slice_op().call(dest, source, ranges, packed_int4);
  }
  WriteSliceInPlace::apply(dest, source, ranges, packed_int4);
}

void write_slice_at_autograd(const at::Tensor& dest, const at::Tensor& source, int64_t dim,
                             const at::Tensor& offsets, bool packed_int4) {
  refuse_tangents("baracuda::write_slice_at_", dest, source);
  if (!check_differentiable_write(dest, source)) {
    at::AutoDispatchBelowAutograd below;
    return write_slice_at_op().call(dest, source, dim, offsets, packed_int4);
  }
  WriteSliceAtInPlace::apply(dest, source, dim, offsets, packed_int4);
}

at::Tensor write_slice_copy_autograd(const at::Tensor& dest, const at::Tensor& source,
                                     c10::SymIntArrayRef ranges, bool packed_int4) {
  refuse_tangents("baracuda::write_slice", dest, source);
  if (!c10::GradMode::is_enabled() || !(dest.requires_grad() || source.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView below;
    return write_slice_copy_op().call(dest, source, ranges, packed_int4);
  }
  return WriteSlice::apply(dest, source, ranges, packed_int4);
}

void write_slice_bump_version(const at::Tensor& dest, const at::Tensor& source,
                              c10::SymIntArrayRef ranges, bool packed_int4) {
  {
    at::AutoDispatchBelowADInplaceOrView below;
    write_slice_op().call(dest, source, ranges, packed_int4);
  }
  torch::autograd::increment_version(dest);
}

void write_slice_at_bump_version(const at::Tensor& dest, const at::Tensor& source, int64_t dim,
                                 const at::Tensor& offsets, bool packed_int4) {
  {
    at::AutoDispatchBelowADInplaceOrView below;
    write_slice_at_op().call(dest, source, dim, offsets, packed_int4);
  }
  torch::autograd::increment_version(dest);
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("write_slice_", &write_slice_autograd);
  m.impl("write_slice_at_", &write_slice_at_autograd);
  m.impl("write_slice", &write_slice_copy_autograd);
}

TORCH_LIBRARY_IMPL(baracuda, ADInplaceOrView, m) {
  m.impl("write_slice_", &write_slice_bump_version);
  m.impl("write_slice_at_", &write_slice_at_bump_version);
}

}  // namespace baracuda
