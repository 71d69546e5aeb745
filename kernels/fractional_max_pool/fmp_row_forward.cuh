// 2-D fractional max pooling forward over bands of output rows, with the
// input rows of a band staged in shared memory.
//
// Neighbouring windows overlap and each cell's k * k loads are scattered, so
// the one-thread-per-cell kernel reads the input through the cache several
// times and spends most of its instructions on window arithmetic. Here a
// block computes its band's window starts once (one per output row and per
// output column), copies the input rows those windows span into shared
// memory (16-byte asynchronous copies when rows are contiguous and aligned),
// and then pools every cell of the band from there.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/compute_types.cuh"
#include "common/cp_async.cuh"
#include "common/cuda_launch.cuh"
#include "common/int_divider.h"
#include "fractional_max_pool/fmp_element.h"
#include "fractional_max_pool/fmp_kernels.h"

namespace baracuda {
namespace fmp {

struct RowBandPlan {
  int64_t bands_per_plane = 0;
  int band_out_rows = 0;   // output rows per block (the last band may be short)
  int tile_rows = 0;       // input rows the tile holds (at least k)
  bool vector_rows = false;  // rows contiguous and 16-byte aligned: copy 16 bytes at a time
  IntDivider div_in_w, div_out_w, div_row_vectors;
  size_t smem_bytes = 0;
};

constexpr int kRowThreads = 256;
constexpr size_t kRowTileBudget = 24 * 1024;  // small enough for several blocks per SM
constexpr int kRowBandMaxOutRows = 16;

// The window starts (one per output column, one per band row) come first in
// shared memory, padded to 16 bytes so that the tile after them is aligned.
BARACUDA_HOST_DEVICE inline size_t row_band_starts_bytes(int64_t out_w, int64_t band_out_rows) {
  return sizeof(int) * static_cast<size_t>((out_w + band_out_rows + 3) / 4 * 4);
}

// False when the row kernel does not apply (3-D, planes past 31-bit offsets,
// or rows too wide for the tile); the caller then runs the per-cell kernel.
inline bool plan_row_bands(const FmpForwardArgs& a, size_t elem_bytes, RowBandPlan& p) {
  const FmpGeometry& g = a.g;
  if (g.dims != 2) return false;
  const int64_t in_h = g.in[0], in_w = g.in[1], out_h = g.out[0], out_w = g.out[1];
  if (in_h * in_w >= (int64_t{1} << 31) || out_h * out_w >= (int64_t{1} << 31)) return false;
  // Consecutive window starts differ by at most floor(step) + 1, the last one
  // by up to one more; one more still covers rounding of the placement. (A
  // band whose rows spread wider anyway is pooled in pieces.)
  const double step = window_step(in_h, out_h, g.kernel[0]);
  const int64_t max_step = static_cast<int64_t>(std::floor(step)) + 2;
  for (int64_t rows_out = std::min<int64_t>(kRowBandMaxOutRows, out_h); rows_out >= 1; --rows_out) {
    const int64_t bands = ceil_div(out_h, rows_out);
    const int64_t even_rows = ceil_div(out_h, bands);  // equal bands, same count
    const int64_t tile_rows = std::min<int64_t>(in_h, (even_rows - 1) * max_step + g.kernel[0]);
    const size_t bytes = row_band_starts_bytes(out_w, even_rows) +
                         static_cast<size_t>(tile_rows * in_w) * elem_bytes;
    if (bytes > kRowTileBudget) continue;
    if (g.batch * g.channels * bands >= (int64_t{1} << 31)) return false;
    p.bands_per_plane = bands;
    p.band_out_rows = static_cast<int>(even_rows);
    p.tile_rows = static_cast<int>(tile_rows);
    const auto aligned = [](int64_t elems, size_t bytes_each) {
      return static_cast<size_t>(elems) * bytes_each % 16 == 0;
    };
    p.vector_rows = a.x_stride[1] == 1 && aligned(in_w, elem_bytes) &&
                    aligned(a.x_stride[0], elem_bytes) && aligned(a.x_stride_n, elem_bytes) &&
                    aligned(a.x_stride_c, elem_bytes) &&
                    reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
    p.div_in_w = IntDivider(static_cast<uint32_t>(in_w));
    p.div_out_w = IntDivider(static_cast<uint32_t>(out_w));
    p.div_row_vectors = IntDivider(static_cast<uint32_t>(std::max<int64_t>(1, in_w * elem_bytes / 16)));
    p.smem_bytes = bytes;
    return true;
  }
  return false;
}

// Copies input rows [r_lo, r_lo + rows) of a plane into the tile.
template <typename T>
__device__ inline void load_rows(const FmpForwardArgs& a, const RowBandPlan& p, const T* x_plane,
                                 int r_lo, int rows, T* tile) {
  const int in_w = static_cast<int>(a.g.in[1]);
  const T* x = x_plane + static_cast<int64_t>(r_lo) * a.x_stride[0];
  if (p.vector_rows) {
    constexpr int kPerVector = 16 / sizeof(T);
    const int vectors = rows * static_cast<int>(p.div_row_vectors.divisor);
    for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
      const int r = static_cast<int>(p.div_row_vectors.div(static_cast<uint32_t>(v)));
      const int col = (v - r * static_cast<int>(p.div_row_vectors.divisor)) * kPerVector;
      cp_async16(tile + r * in_w + col, x + r * a.x_stride[0] + col);
    }
    cp_async_commit();
    cp_async_wait<0>();
    return;
  }
  const int elems = rows * in_w;
  constexpr int kLoadsInFlight = 4;
  for (int e0 = 0; e0 < elems; e0 += kLoadsInFlight * blockDim.x) {
    T v[kLoadsInFlight];
#pragma unroll
    for (int b = 0; b < kLoadsInFlight; ++b) {
      const int e = e0 + b * blockDim.x + threadIdx.x;
      if (e < elems) {
        const int r = static_cast<int>(p.div_in_w.div(static_cast<uint32_t>(e)));
        v[b] = x[r * a.x_stride[0] + (e - r * in_w) * a.x_stride[1]];
      }
    }
#pragma unroll
    for (int b = 0; b < kLoadsInFlight; ++b) {
      const int e = e0 + b * blockDim.x + threadIdx.x;
      if (e < elems) tile[e] = v[b];
    }
  }
}

template <int K, typename T>
__global__ void __launch_bounds__(kRowThreads, 8)
fmp_row_forward_kernel(FmpForwardArgs a, RowBandPlan p) {
  using C = compute_t<T>;
  const FmpGeometry& g = a.g;
  const int in_w = static_cast<int>(g.in[1]), out_w = static_cast<int>(g.out[1]);
  const int kh = K ? K : static_cast<int>(g.kernel[0]), kw = K ? K : static_cast<int>(g.kernel[1]);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int* start_w = reinterpret_cast<int*>(smem_raw);
  int* start_h = start_w + out_w;
  T* tile = reinterpret_cast<T*>(smem_raw + row_band_starts_bytes(out_w, p.band_out_rows));

  const int64_t plane = blockIdx.x / p.bands_per_plane;
  const int o_lo = static_cast<int>((blockIdx.x - plane * p.bands_per_plane) * p.band_out_rows);
  const int o_rows = min(p.band_out_rows, static_cast<int>(g.out[0]) - o_lo);
  {
    const C* samples = static_cast<const C*>(g.samples);
    const AxisWindows<C> wh(g, samples, plane, 0), ww(g, samples, plane, 1);
    for (int i = threadIdx.x; i < out_w + o_rows; i += blockDim.x) {
      if (i < out_w) {
        start_w[i] = static_cast<int>(ww.start(i));
      } else {
        start_h[i - out_w] = static_cast<int>(wh.start(o_lo + i - out_w));
      }
    }
  }
  __syncthreads();
  const int64_t n = plane / g.channels, c = plane - n * g.channels;
  const T* x_plane = static_cast<const T*>(a.x) + n * a.x_stride_n + c * a.x_stride_c;
  const int64_t out_base = plane * g.out[0] * out_w + static_cast<int64_t>(o_lo) * out_w;
  T* out = static_cast<T*>(a.out) + out_base;
  int64_t* indices = a.indices + out_base;

  // Output rows [oa, ob) whose input rows fit the tile; normally the whole band.
  for (int oa = 0; oa < o_rows;) {
    int ob = oa + 1;
    while (ob < o_rows && start_h[ob] + kh - start_h[oa] <= p.tile_rows) ++ob;
    const int r_lo = start_h[oa];
    load_rows<T>(a, p, x_plane, r_lo, start_h[ob - 1] + kh - r_lo, tile);
    __syncthreads();
    for (int e = oa * out_w + threadIdx.x; e < ob * out_w; e += blockDim.x) {
      const int oh = static_cast<int>(p.div_out_w.div(static_cast<uint32_t>(e)));
      const int h0 = start_h[oh], w0 = start_w[e - oh * out_w];
      const T* corner = tile + (h0 - r_lo) * in_w + w0;
      WindowMax<C> best(h0 * in_w + w0);
#pragma unroll
      for (int dh = 0; dh < kh; ++dh) {
#pragma unroll
        for (int dw = 0; dw < kw; ++dw) {
          best.consider(to_compute(corner[dh * in_w + dw]), (h0 + dh) * in_w + w0 + dw);
        }
      }
      out[e] = from_compute<T>(best.value);
      indices[e] = best.index;
    }
    oa = ob;
    __syncthreads();
  }
}

}  // namespace fmp
}  // namespace baracuda
