// Op layer of fractional max pooling (2-D and 3-D): validation, window
// arithmetic set-up and dispatch.
//
//   fractional_max_pool(x, kernel_size, output_size, samples, placement) -> (out, indices)
//   fractional_max_pool_backward(grad_out, indices, samples, input_size, kernel_size,
//                                placement) -> grad_x
//
// len(kernel_size) (2 or 3) is the number of spatial axes; x is
// [C, spatial...] or [N, C, spatial...].
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "common/torch_glue.h"
#include "fractional_max_pool/fmp_kernels.h"

namespace baracuda {
namespace {

bool parse_placement(const char* op, c10::string_view placement) {
  if (placement == "torch") return false;
  if (placement == "even") return true;
  TORCH_CHECK(false, "baracuda::", op, ": placement='", std::string(placement),
              "' must be 'torch' (PyTorch's windows) or 'even' (evenly spaced windows)");
  return false;
}

// (in - k) / (out - 1) rounded as the torch placement computes it: in the
// input's own type on CPU (PyTorch's CPU kernels), in float32 (float64 for
// float64) on CUDA.
template <typename A>
double alpha_in(int64_t in, int64_t out, int64_t k) {
  return static_cast<double>(static_cast<A>(in - k) / static_cast<A>(out - 1));
}

double window_alpha(const at::Tensor& x, int64_t in, int64_t out, int64_t k) {
  if (out <= 1) return 0.0;
  switch (x.scalar_type()) {
    case at::kDouble: return alpha_in<double>(in, out, k);
    case at::kHalf: return x.is_cpu() ? alpha_in<c10::Half>(in, out, k) : alpha_in<float>(in, out, k);
    case at::kBFloat16:
      return x.is_cpu() ? alpha_in<c10::BFloat16>(in, out, k) : alpha_in<float>(in, out, k);
    default: return alpha_in<float>(in, out, k);
  }
}

// The geometry shared by forward and backward. `full_in`: x's shape.
FmpGeometry geometry(const char* op, at::IntArrayRef full_in, at::IntArrayRef kernel_size,
                     at::IntArrayRef out_sizes, const at::Tensor& like, const at::Tensor& samples,
                     c10::string_view placement) {
  const int dims = static_cast<int>(kernel_size.size());
  TORCH_CHECK(dims == 2 || dims == 3, "baracuda::", op, ": kernel_size=", kernel_size,
              " must have 2 or 3 entries (the spatial axes)");
  const int rank = static_cast<int>(full_in.size());
  TORCH_CHECK(rank == dims + 1 || rank == dims + 2, "baracuda::", op, ": the input has ", rank,
              " dims (shape ", full_in, "); a ", dims, "-D pool takes ", dims + 1, " (C, spatial) or ",
              dims + 2, " (N, C, spatial)");
  TORCH_CHECK(static_cast<int>(out_sizes.size()) == dims, "baracuda::", op, ": output_size=",
              out_sizes, " must have ", dims, " entries");
  FmpGeometry g;
  g.dtype = float_dtype_of(op, "x", like);
  g.dims = dims;
  g.even = parse_placement(op, placement);
  g.batch = rank == dims + 2 ? full_in[0] : 1;
  g.channels = full_in[rank - dims - 1];
  static const char* const kAxis[3] = {"first", "second", "third"};
  for (int a = 0; a < dims; ++a) {
    const int64_t in = full_in[rank - dims + a], k = kernel_size[a], out = out_sizes[a];
    TORCH_CHECK(k > 0, "baracuda::", op, ": kernel_size=", kernel_size, " must be positive");
    TORCH_CHECK(k <= in, "baracuda::", op, ": kernel_size=", kernel_size,
                " is larger than the input's spatial size ", full_in.slice(rank - dims));
    TORCH_CHECK(out > 0, "baracuda::", op, ": output_size=", out_sizes, " must be positive");
    TORCH_CHECK(out + k - 1 <= in, "baracuda::", op, ": output_size=", out_sizes,
                " is too large along the ", kAxis[a], " spatial axis: at most input - kernel + 1 = ",
                in - k + 1);
    g.in[a] = in;
    g.out[a] = out;
    g.kernel[a] = k;
    g.alpha[a] = window_alpha(like, in, out, k);
    // PyTorch's sample order: 2-D (w, h), 3-D (t, h, w).
    g.sample_index[a] = dims == 2 ? 1 - a : a;
  }
  const int64_t sample_shape[3] = {g.batch, g.channels, dims};
  TORCH_CHECK(samples.sizes() == at::IntArrayRef(sample_shape), "baracuda::", op,
              ": samples.shape=", samples.sizes(), " must be ", at::IntArrayRef(sample_shape),
              " (batch, channels, one sample per spatial axis)");
  TORCH_CHECK(samples.scalar_type() == like.scalar_type() || samples.scalar_type() == at::kFloat,
              "baracuda::", op, ": samples.dtype=", samples.scalar_type(), " must be ",
              like.scalar_type(), " (the input's) or Float");
  TORCH_CHECK(samples.device() == like.device(), "baracuda::", op, ": samples is on ",
              samples.device(), " but the input is on ", like.device());
  return g;
}

// Samples as the kernels read them: contiguous float32 (float64 for float64 inputs).
at::Tensor kernel_samples(const at::Tensor& samples, const at::Tensor& like) {
  const at::ScalarType want = like.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // Most calls pass them so already: no dispatch then (a host cost per call).
  if (samples.scalar_type() == want && samples.is_contiguous()) return samples;
  return samples.to(want).contiguous();
}

// Strides of the (n, c, spatial...) axes of a [C, spatial] or [N, C, spatial] tensor.
void plane_strides(const at::Tensor& t, int dims, int64_t& sn, int64_t& sc, int64_t (&s)[3]) {
  const int rank = static_cast<int>(t.dim());
  sn = rank == dims + 2 ? t.stride(0) : 0;
  sc = t.stride(rank - dims - 1);
  for (int a = 0; a < dims; ++a) s[a] = t.stride(rank - dims + a);
}

std::vector<int64_t> with_spatial(at::IntArrayRef full, int dims, at::IntArrayRef spatial) {
  std::vector<int64_t> shape(full.begin(), full.end() - dims);
  shape.insert(shape.end(), spatial.begin(), spatial.end());
  return shape;
}

std::tuple<at::Tensor, at::Tensor> fractional_max_pool(const at::Tensor& x,
                                                        at::IntArrayRef kernel_size,
                                                        c10::SymIntArrayRef sym_output_size,
                                                        const at::Tensor& samples,
                                                        c10::string_view placement) {
  const char* op = "fractional_max_pool";
  const at::IntArrayRef output_size = C10_AS_INTARRAYREF_SLOW(sym_output_size);
  TORCH_CHECK(x.layout() == at::kStrided, "baracuda::", op, ": x must be a strided tensor");
  FmpGeometry g = geometry(op, x.sizes(), kernel_size, output_size, x, samples, placement);
  const auto shape = with_spatial(x.sizes(), g.dims, output_size);
  at::Tensor out = new_empty(shape, x.options());
  at::Tensor indices = new_empty(shape, x.options().dtype(at::kLong));
  if (out.numel() == 0) return {out, indices};
  const at::Tensor s = kernel_samples(samples, x);
  FmpForwardArgs a;
  a.g = g;
  a.g.samples = s.data_ptr();
  a.x = x.data_ptr();
  plane_strides(x, g.dims, a.x_stride_n, a.x_stride_c, a.x_stride);
  a.out = out.data_ptr();
  a.indices = indices.data_ptr<int64_t>();
  run_on_device<FmpForwardArgs>(op, "forward", a, x, &fmp_forward_cpu,
                                BARACUDA_CUDA_ONLY(&fmp_forward_cuda));
  return {out, indices};
}

at::Tensor fractional_max_pool_backward(const at::Tensor& grad_out, const at::Tensor& indices,
                                        const at::Tensor& samples,
                                        c10::SymIntArrayRef sym_input_size,
                                        at::IntArrayRef kernel_size, c10::string_view placement) {
  const char* op = "fractional_max_pool_backward";
  const at::IntArrayRef input_size = C10_AS_INTARRAYREF_SLOW(sym_input_size);
  TORCH_CHECK(grad_out.layout() == at::kStrided && indices.layout() == at::kStrided,
              "baracuda::", op, ": grad_out and indices must be strided tensors");
  const int dims = static_cast<int>(kernel_size.size());
  TORCH_CHECK(grad_out.dim() == static_cast<int64_t>(input_size.size()), "baracuda::", op,
              ": grad_out.dim()=", grad_out.dim(), " must equal len(input_size)=", input_size.size());
  TORCH_CHECK(dims >= 2 && grad_out.dim() > dims, "baracuda::", op, ": kernel_size=",
              kernel_size, " does not fit grad_out.shape=", grad_out.sizes());
  const at::IntArrayRef out_sizes = grad_out.sizes().slice(grad_out.dim() - dims);
  FmpGeometry g = geometry(op, input_size, kernel_size, out_sizes, grad_out, samples, placement);
  TORCH_CHECK(grad_out.sizes() == at::IntArrayRef(with_spatial(input_size, dims, out_sizes)),
              "baracuda::", op, ": grad_out.shape=", grad_out.sizes(),
              " does not match input_size=", input_size);
  TORCH_CHECK(indices.sizes() == grad_out.sizes(), "baracuda::", op, ": indices.shape=",
              indices.sizes(), " must equal grad_out.shape=", grad_out.sizes());
  TORCH_CHECK(indices.scalar_type() == at::kLong, "baracuda::", op, ": indices.dtype=",
              indices.scalar_type(), " must be Long");
  TORCH_CHECK(indices.device() == grad_out.device(), "baracuda::", op, ": indices is on ",
              indices.device(), " but grad_out is on ", grad_out.device());
  at::Tensor grad_in = new_empty(input_size, grad_out.options());
  if (grad_in.numel() == 0) return grad_in;
  const at::Tensor s = kernel_samples(samples, grad_out);
  FmpBackwardArgs a;
  a.g = g;
  a.g.samples = s.data_ptr();
  a.grad_out = grad_out.data_ptr();
  plane_strides(grad_out, dims, a.go_stride_n, a.go_stride_c, a.go_stride);
  a.indices = indices.data_ptr<int64_t>();
  plane_strides(indices, dims, a.ix_stride_n, a.ix_stride_c, a.ix_stride);
  a.grad_in = grad_in.data_ptr();
  int64_t cover_entries = fmp_cover_entries(g);
#ifdef BARACUDA_WITH_CUDA
  if (grad_out.is_cuda()) cover_entries = fmp_backward_cover_entries_cuda(g);
#endif
  // The band kernel needs no cover table: nothing to allocate for it.
  at::Tensor cover;
  if (cover_entries > 0) {
    cover = new_empty({2 * cover_entries}, grad_out.options().dtype(at::kInt));
    a.cover = cover.data_ptr<int32_t>();
  }
  run_on_device<FmpBackwardArgs>(op, "backward", a, grad_out, &fmp_backward_cpu,
                                 BARACUDA_CUDA_ONLY(&fmp_backward_cuda));
  return grad_in;
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("fractional_max_pool", &fractional_max_pool);
  m.impl("fractional_max_pool_backward", &fractional_max_pool_backward);
}

#ifdef BARACUDA_WITH_CUDA
TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("fractional_max_pool", &fractional_max_pool);
  m.impl("fractional_max_pool_backward", &fractional_max_pool_backward);
}
#endif

}  // namespace baracuda
