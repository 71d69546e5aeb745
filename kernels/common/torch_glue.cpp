#include "common/torch_glue.h"

#include <ATen/EmptyTensor.h>
#include <c10/util/Exception.h>

namespace baracuda {

void check_status(const KernelStatus& status, const char* op, const char* what) {
  TORCH_CHECK(status.is_ok(), "baracuda::", op, ": ", what, " failed: ", status.detail);
}

FloatDtype float_dtype_of(const char* op, const char* name, const at::Tensor& t) {
  return float_dtype_of(op, name, t.scalar_type());
}

FloatDtype float_dtype_of(const char* op, const char* name, at::ScalarType t) {
  switch (t) {
    case at::kHalf: return FloatDtype::kFloat16;
    case at::kBFloat16: return FloatDtype::kBFloat16;
    case at::kFloat: return FloatDtype::kFloat32;
    case at::kDouble: return FloatDtype::kFloat64;
    default:
      TORCH_CHECK(false, "baracuda::", op, ": ", name, ".dtype=", t,
                  " is not supported; use float16, bfloat16, float32 or float64");
  }
  return FloatDtype::kFloat32;
}

at::Tensor new_empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
#ifdef BARACUDA_WITH_CUDA
  if (options.device().is_cuda()) return new_empty_cuda(sizes, options);
#endif
  TORCH_CHECK(options.device().is_cpu(), "baracuda: no allocator for device ", options.device());
  return at::detail::empty_cpu(sizes, options);
}

StorageSpan storage_span(int64_t storage_offset, at::IntArrayRef sizes,
                         at::IntArrayRef strides) {
  StorageSpan span{storage_offset, storage_offset};
  for (size_t d = 0; d < sizes.size(); ++d) span.last += (sizes[d] - 1) * strides[d];
  return span;
}

bool spans_intersect(const at::Tensor& a, const StorageSpan& a_span, const at::Tensor& b,
                     const StorageSpan& b_span) {
  if (!a.has_storage() || !b.has_storage()) return false;
  if (!a.storage().is_alias_of(b.storage())) return false;
  // Compare in bytes: the two views may have different element sizes.
  const int64_t ea = a.element_size(), eb = b.element_size();
  const int64_t a_first = a_span.first * ea, a_end = (a_span.last + 1) * ea;
  const int64_t b_first = b_span.first * eb, b_end = (b_span.last + 1) * eb;
  return a_first < b_end && b_first < a_end;
}

}  // namespace baracuda
