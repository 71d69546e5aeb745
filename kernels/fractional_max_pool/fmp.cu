// CUDA executors of fractional max pooling. Forward: 2-D over bands of output
// rows staged in shared memory (fmp_row_forward.cuh), else one thread per
// output cell. Backward (no atomics, so the gradient is deterministic): bands
// of input rows where each element is written by the leader of the cells
// naming it (fmp_band_backward.cuh), else one thread per input element
// gathering over a cover table. The per-cell and per-element code is shared
// with the host (fmp_element.h). Windows use float32 arithmetic (float64 for
// float64 inputs), as PyTorch's CUDA kernels do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "common/compute_types.cuh"
#include "common/cuda_launch.cuh"
#include "fractional_max_pool/fmp_band_backward.cuh"
#include "fractional_max_pool/fmp_element.h"
#include "fractional_max_pool/fmp_kernels.h"
#include "fractional_max_pool/fmp_row_forward.cuh"

namespace baracuda {
namespace {

template <int DIMS, typename Index>
using DeviceSplit = fmp::PlaneSplit<DIMS, Index, typename DividerFor<Index>::type>;

template <int DIMS, int K, typename T, typename Index>
__global__ void __launch_bounds__(256)
fmp_forward_kernel(FmpForwardArgs a, DeviceSplit<DIMS, Index> split, Index total) {
  using C = compute_t<T>;
  for (Index i = blockIdx.x * Index{blockDim.x} + threadIdx.x; i < total;
       i += Index{gridDim.x} * blockDim.x) {
    fmp::pool_one<DIMS, K, T, C, C, C>(a, split, i);
  }
}

// The cubic or square kernel size when it is one of the unrolled ones (2, 3), else 0.
int unrolled_kernel(const FmpGeometry& g) {
  const int64_t k = g.kernel[0];
  for (int ax = 1; ax < g.dims; ++ax) {
    if (g.kernel[ax] != k) return 0;
  }
  return (k == 2 || k == 3) ? static_cast<int>(k) : 0;
}

template <typename T>
__global__ void __launch_bounds__(256) fmp_cover_kernel(FmpBackwardArgs a, int64_t total) {
  using C = compute_t<T>;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    fmp::cover_one<C, C>(a, i);
  }
}

template <int DIMS, typename T, typename Index>
__global__ void __launch_bounds__(256)
fmp_backward_kernel(FmpBackwardArgs a, DeviceSplit<DIMS, Index> split, Index total) {
  using C = compute_t<T>;
  for (Index i = blockIdx.x * Index{blockDim.x} + threadIdx.x; i < total;
       i += Index{gridDim.x} * blockDim.x) {
    fmp::gather_one<DIMS, T, C>(a, split, i);
  }
}

// Launches kernel<T, Index> over `total` elements, 31-bit indices when they fit.
template <typename Launch>
KernelStatus over_elements(int64_t total, Launch&& launch) {
  if (total == 0) return KernelStatus::ok();
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>(ceil_div(total, threads), int64_t{1} << 20);
  if (total < (int64_t{1} << 31)) {
    launch(uint32_t{}, static_cast<unsigned>(blocks), threads);
  } else {
    launch(int64_t{}, static_cast<unsigned>(blocks), threads);
  }
  return launch_status();
}

// The 2-D forward over bands of output rows (fmp_row_forward.cuh).
template <typename T>
KernelStatus launch_row_forward(const FmpForwardArgs& a, const fmp::RowBandPlan& plan, int k,
                                cudaStream_t s) {
  if (plan.bands == 0) return KernelStatus::ok();
  auto launch = [&](auto kernel) {
    const unsigned grid = resident_blocks(kernel, fmp::kRowThreads, plan.smem_bytes, plan.bands);
    kernel<<<grid, fmp::kRowThreads, plan.smem_bytes, s>>>(a, plan);
  };
  if (k == 2) {
    launch(fmp::fmp_row_forward_kernel<2, T>);
  } else if (k == 3) {
    launch(fmp::fmp_row_forward_kernel<3, T>);
  } else {
    launch(fmp::fmp_row_forward_kernel<0, T>);
  }
  return launch_status();
}

// Calls fn(dims constant, T value) for the geometry's rank and dtype.
template <typename Fn>
KernelStatus dispatch(const FmpGeometry& g, Fn&& fn) {
  return dispatch_float_dtype<__half, __nv_bfloat16>(g.dtype, [&](auto t) {
    return fmp_dispatch_dims(g.dims, [&](auto dims_c) { return fn(dims_c, t); });
  });
}

}  // namespace

KernelStatus fmp_forward_cuda(const FmpForwardArgs& a, void* stream) {
  const int64_t total = fmp_elements(a.g, a.g.out);
  return dispatch(a.g, [&](auto dims_c, auto t) {
    constexpr int D = decltype(dims_c)::value;
    using T = decltype(t);
    const int k = unrolled_kernel(a.g);
    if constexpr (D == 2) {
      fmp::RowBandPlan plan;
      if (fmp::plan_row_bands(a, sizeof(T), plan)) {
        return launch_row_forward<T>(a, plan, k, static_cast<cudaStream_t>(stream));
      }
    }
    return over_elements(total, [&](auto index_c, unsigned blocks, int threads) {
      using Index = decltype(index_c);
      const DeviceSplit<D, Index> split(a.g.out, a.g.channels);
      const auto s = static_cast<cudaStream_t>(stream);
      const Index n = static_cast<Index>(total);
      if (k == 2) {
        fmp_forward_kernel<D, 2, T, Index><<<blocks, threads, 0, s>>>(a, split, n);
      } else if (k == 3) {
        fmp_forward_kernel<D, 3, T, Index><<<blocks, threads, 0, s>>>(a, split, n);
      } else {
        fmp_forward_kernel<D, 0, T, Index><<<blocks, threads, 0, s>>>(a, split, n);
      }
    });
  });
}

namespace {

// The band decomposition of the backward, if its kernel applies.
bool backward_band_plan(const FmpGeometry& g, fmp::BandPlan& plan) {
  const size_t compute_bytes = g.dtype == FloatDtype::kFloat64 ? sizeof(double) : sizeof(float);
  return fmp_elements(g, g.in) > 0 && fmp::plan_bands(g, compute_bytes, plan);
}

}  // namespace

int64_t fmp_backward_cover_entries_cuda(const FmpGeometry& g) {
  fmp::BandPlan plan;
  return backward_band_plan(g, plan) ? 0 : fmp_cover_entries(g);
}

KernelStatus fmp_backward_cuda(const FmpBackwardArgs& a, void* stream) {
  const int64_t total = fmp_elements(a.g, a.g.in);
  return dispatch(a.g, [&](auto dims_c, auto t) {
    constexpr int D = decltype(dims_c)::value;
    using T = decltype(t);
    const auto s = static_cast<cudaStream_t>(stream);
    fmp::BandPlan plan;
    if (backward_band_plan(a.g, plan)) {
      const auto grid = static_cast<unsigned>(a.g.batch * a.g.channels * plan.bands_per_plane);
      if (plan.staged) {
        fmp::fmp_band_backward_kernel<D, true, T>
            <<<grid, fmp::kBandThreads, plan.smem_bytes, s>>>(a, plan);
      } else {
        fmp::fmp_band_backward_kernel<D, false, T>
            <<<grid, fmp::kBandThreads, plan.smem_bytes, s>>>(a, plan);
      }
      return launch_status();
    }
    // Planes too large for the band kernel: the per-element gather over a cover table.
    const int64_t entries = fmp_cover_entries(a.g);
    const KernelStatus cover = over_elements(entries, [&](auto, unsigned blocks, int threads) {
      fmp_cover_kernel<T><<<blocks, threads, 0, s>>>(a, entries);
    });
    if (!cover.is_ok()) return cover;
    return over_elements(total, [&](auto index_c, unsigned blocks, int threads) {
      using Index = decltype(index_c);
      fmp_backward_kernel<D, T, Index><<<blocks, threads, 0, s>>>(
          a, DeviceSplit<D, Index>(a.g.in, a.g.channels), static_cast<Index>(total));
    });
  });
}

}  // namespace baracuda
