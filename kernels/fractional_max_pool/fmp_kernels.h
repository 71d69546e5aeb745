// Launch contracts of fractional max pooling (2-D and 3-D), over raw pointers.
//
// Planes are the (n, c) pairs; each has `dims` spatial axes (2 or 3, outermost
// first). Along axis a, output cell o pools input positions
// [start_a(o), start_a(o) + k_a), where start_a comes from the plane's sample
// for that axis (fmp_windows.h). Output and indices are contiguous
// [N, C, out...]; an index is the flat position inside its input plane, as
// torch's are. The backward uses no atomics: every input element gets the sum
// of the gradients of the output cells whose window covers it and whose index
// names it, added in output order, so it is deterministic.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/float_dtype.h"
#include "common/status.h"

namespace baracuda {

struct FmpGeometry {
  FloatDtype dtype = FloatDtype::kFloat32;
  int dims = 2;
  bool even = false;        // placement "even" (the evenly spaced formula) vs "torch"
  int64_t batch = 0, channels = 0;
  int64_t in[3] = {}, out[3] = {}, kernel[3] = {};
  // (in - k) / (out - 1) per axis, already rounded to the arithmetic the
  // torch placement uses (fmp_windows.h); unused when out == 1 or even.
  double alpha[3] = {};
  int sample_index[3] = {};  // which entry of a plane's samples drives each axis
  // Samples [N, C, dims], contiguous: float32, or float64 for float64 inputs.
  const void* samples = nullptr;
};

struct FmpForwardArgs {
  FmpGeometry g;
  const void* x = nullptr;
  int64_t x_stride_n = 0, x_stride_c = 0, x_stride[3] = {};  // elements
  void* out = nullptr;          // contiguous [N, C, out...]
  int64_t* indices = nullptr;   // contiguous [N, C, out...]
};

struct FmpBackwardArgs {
  FmpGeometry g;
  const void* grad_out = nullptr;
  int64_t go_stride_n = 0, go_stride_c = 0, go_stride[3] = {};
  const int64_t* indices = nullptr;
  int64_t ix_stride_n = 0, ix_stride_c = 0, ix_stride[3] = {};
  void* grad_in = nullptr;      // contiguous [N, C, in...]
  // Scratch of 2 * N * C * sum(in) int32, the covering ranges (fmp_element.h);
  // on CUDA only as many as fmp_backward_cover_entries_cuda asks for.
  int32_t* cover = nullptr;
};

// Calls fn(dims constant) for 2 or 3 spatial axes.
template <typename Fn>
KernelStatus fmp_dispatch_dims(int dims, Fn&& fn) {
  if (dims == 2) return fn(std::integral_constant<int, 2>{});
  if (dims == 3) return fn(std::integral_constant<int, 3>{});
  return KernelStatus::invalid("fractional_max_pool: dims must be 2 or 3");
}

// Elements of a contiguous [N, C, sizes...] array (sizes: g.in or g.out).
inline int64_t fmp_elements(const FmpGeometry& g, const int64_t* sizes) {
  int64_t n = g.batch * g.channels;
  for (int a = 0; a < g.dims; ++a) n *= sizes[a];
  return n;
}

// Elements of the backward's cover table.
inline int64_t fmp_cover_entries(const FmpGeometry& g) {
  int64_t sum_in = 0;
  for (int a = 0; a < g.dims; ++a) sum_in += g.in[a];
  return g.batch * g.channels * sum_in;
}

// Cover-table entries the CUDA backward needs (args.cover): none when its
// band kernel applies, which works the ranges out in shared memory.
int64_t fmp_backward_cover_entries_cuda(const FmpGeometry& g);

KernelStatus fmp_forward_cuda(const FmpForwardArgs& args, void* stream);
KernelStatus fmp_backward_cuda(const FmpBackwardArgs& args, void* stream);
KernelStatus fmp_forward_cpu(const FmpForwardArgs& args);
KernelStatus fmp_backward_cpu(const FmpBackwardArgs& args);

}  // namespace baracuda
