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
//
// The grid is only as large as the GPU holds at once, and each block walks
// its share of the bands with kRowStages tiles: while it pools one band, the
// copies of its next band are already in flight, so a block never idles
// between loading and pooling. Instruction issue is nearly as tight as
// memory here, so per-band work is kept small: window starts are placed once
// per band, a band that fits its tile skips the piece search, and each
// thread pools a fixed output column (no division per cell).
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
  int64_t bands = 0;       // in all planes
  int band_out_rows = 0;   // output rows per block (the last band may be short)
  int tile_rows = 0;       // input rows the tile holds (at least k)
  bool vector_rows = false;  // rows contiguous and 16-byte aligned: copy 16 bytes at a time
  bool dense_rows = false;   // ... and back to back, so a run of rows is one run of vectors
  IntDivider div_in_w, div_out_w, div_row_vectors, div_bands_per_plane;
  size_t smem_bytes = 0;
};

constexpr int kRowThreads = 256;
constexpr int kRowStages = 2;  // bands in flight per block: one pooled, the others loading
// All stages. Tiles near 13 KiB measured best for every dtype on H100 (f32:
// 14 output rows of 56; bf16: 28); larger ones were slower.
constexpr size_t kRowSmemBudget = 28 * 1024;
static_assert(kRowSmemBudget <= 48 * 1024, "past 48 KiB the launch must opt in to more shared memory");
constexpr int kRowBandMaxOutRows = 32;  // below this, the budget decides

// Shared memory of a block, per stage: the window starts (one per output
// column, one per band row), then the tiles of input rows, each padded to 16
// bytes so that the tiles are aligned.
struct RowBandSmem {
  size_t starts = 0, tile = 0;
  BARACUDA_HOST_DEVICE size_t total() const { return kRowStages * (starts + tile); }
};

BARACUDA_HOST_DEVICE inline RowBandSmem row_band_smem(int64_t out_w, int64_t band_out_rows,
                                                      int64_t tile_rows, int64_t in_w,
                                                      size_t elem_bytes) {
  RowBandSmem m;
  m.starts = sizeof(int) * static_cast<size_t>((out_w + band_out_rows + 3) / 4 * 4);
  m.tile = (static_cast<size_t>(tile_rows * in_w) * elem_bytes + 15) / 16 * 16;
  return m;
}

// False when the row kernel does not apply (3-D, planes past 31-bit offsets,
// or rows too wide for the tiles); the caller then runs the per-cell kernel.
inline bool plan_row_bands(const FmpForwardArgs& a, size_t elem_bytes, RowBandPlan& p) {
  const FmpGeometry& g = a.g;
  if (g.dims != 2) return false;
  const int64_t in_h = g.in[0], in_w = g.in[1], out_h = g.out[0], out_w = g.out[1];
  if (in_h * in_w >= (int64_t{1} << 31) || out_h * out_w >= (int64_t{1} << 31)) return false;
  // m + 1 consecutive window starts span at most ceil(m * step) rows, one
  // more for the rounding of the placement (the last start only sits
  // closer). A band whose rows spread wider anyway is pooled in pieces.
  const double step = window_step(in_h, out_h, g.kernel[0]);
  for (int64_t rows_out = std::min<int64_t>(kRowBandMaxOutRows, out_h); rows_out >= 1; --rows_out) {
    const int64_t bands = ceil_div(out_h, rows_out);
    const int64_t even_rows = ceil_div(out_h, bands);  // equal bands, same count
    const int64_t spread = static_cast<int64_t>(std::ceil(static_cast<double>(even_rows - 1) * step));
    const int64_t tile_rows = std::min<int64_t>(in_h, spread + 1 + g.kernel[0]);
    const RowBandSmem smem = row_band_smem(out_w, even_rows, tile_rows, in_w, elem_bytes);
    if (smem.total() > kRowSmemBudget) continue;
    p.bands = g.batch * g.channels * bands;
    if (p.bands >= (int64_t{1} << 31)) return false;
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
    p.dense_rows = p.vector_rows && a.x_stride[0] == in_w;
    p.div_in_w = IntDivider(static_cast<uint32_t>(in_w));
    p.div_out_w = IntDivider(static_cast<uint32_t>(out_w));
    p.div_bands_per_plane = IntDivider(static_cast<uint32_t>(bands));
    p.div_row_vectors = IntDivider(static_cast<uint32_t>(std::max<int64_t>(1, in_w * elem_bytes / 16)));
    p.smem_bytes = smem.total();
    return true;
  }
  return false;
}

// Starts copying input rows [r_lo, r_lo + rows) of a plane into the tile:
// asynchronously (the caller commits and waits) when rows are vector-aligned,
// else with plain loads that are done on return.
template <typename T>
__device__ inline void copy_rows(const FmpForwardArgs& a, const RowBandPlan& p, const T* x_plane,
                                 int r_lo, int rows, T* tile) {
  const int in_w = static_cast<int>(a.g.in[1]);
  const T* x = x_plane + static_cast<int64_t>(r_lo) * a.x_stride[0];
  if (p.vector_rows) {
    constexpr int kPerVector = 16 / sizeof(T);
    const int vectors = rows * static_cast<int>(p.div_row_vectors.divisor);
    if (p.dense_rows) {
      for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
        cp_async16(tile + v * kPerVector, x + v * kPerVector);
      }
      return;
    }
    for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
      const int r = static_cast<int>(p.div_row_vectors.div(static_cast<uint32_t>(v)));
      const int col = (v - r * static_cast<int>(p.div_row_vectors.divisor)) * kPerVector;
      cp_async16(tile + r * in_w + col, x + r * a.x_stride[0] + col);
    }
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

// One band of output rows: its plane and its rows [o_lo, o_lo + o_rows).
struct RowBand {
  int plane, o_lo, o_rows;
};

__device__ inline RowBand locate_band(const RowBandPlan& p, int band, int out_h) {
  RowBand b;
  b.plane = static_cast<int>(p.div_bands_per_plane.div(static_cast<uint32_t>(band)));
  b.o_lo = (band - b.plane * static_cast<int>(p.bands_per_plane)) * p.band_out_rows;
  b.o_rows = min(p.band_out_rows, out_h - b.o_lo);
  return b;
}

template <typename T>
__device__ inline const T* plane_input(const FmpForwardArgs& a, int64_t plane) {
  const int64_t n = plane / a.g.channels, c = plane - n * a.g.channels;
  return static_cast<const T*>(a.x) + n * a.x_stride_n + c * a.x_stride_c;
}

template <int K, typename T>
__global__ void __launch_bounds__(kRowThreads, 4)
fmp_row_forward_kernel(FmpForwardArgs a, RowBandPlan p) {
  using C = compute_t<T>;
  const FmpGeometry& g = a.g;
  const int in_w = static_cast<int>(g.in[1]), out_w = static_cast<int>(g.out[1]);
  const int out_h = static_cast<int>(g.out[0]);
  const int kh = K ? K : static_cast<int>(g.kernel[0]), kw = K ? K : static_cast<int>(g.kernel[1]);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const RowBandSmem layout = row_band_smem(out_w, p.band_out_rows, p.tile_rows, in_w, sizeof(T));
  const int starts_bytes = static_cast<int>(layout.starts), tile_bytes = static_cast<int>(layout.tile);
  // Buffer b: its starts (columns, then band rows) and its tile.
  auto starts_of = [&](int b) { return reinterpret_cast<int*>(smem_raw + b * starts_bytes); };
  auto tile_of = [&](int b) {
    return reinterpret_cast<T*>(smem_raw + kRowStages * starts_bytes + b * tile_bytes);
  };
  // The band's window starts, one axis at a time (the window arithmetic is
  // register-hungry).
  auto place_windows = [&](const RowBand& band, int b) {
    const C* samples = static_cast<const C*>(g.samples);
    int* starts = starts_of(b);
    if (threadIdx.x < out_w) {
      const AxisWindows<C> ww(g, samples, band.plane, 1);
      for (int i = threadIdx.x; i < out_w; i += blockDim.x) starts[i] = static_cast<int>(ww.start(i));
    }
    if (threadIdx.x < band.o_rows) {
      const AxisWindows<C> wh(g, samples, band.plane, 0);
      for (int i = threadIdx.x; i < band.o_rows; i += blockDim.x) {
        starts[out_w + i] = static_cast<int>(wh.start(band.o_lo + i));
      }
    }
  };
  // Starts copying the input rows of the band's first piece (normally the
  // whole band; see the pooling loop) into tile b. Its starts must be visible.
  auto copy_band = [&](const RowBand& band, int b) {
    const int* start_h = starts_of(b) + out_w;
    const int r_lo = start_h[0], r_end = start_h[band.o_rows - 1] + kh;
    copy_rows<T>(a, p, plane_input<T>(a, band.plane), r_lo, min(r_end - r_lo, p.tile_rows),
                 tile_of(b));
    cp_async_commit();
  };
  // Each thread keeps one output column (and pools every rows_per_pass-th
  // row) while a row fits the block, so the cell's position needs no division.
  const int rows_per_pass = max(1, static_cast<int>(blockDim.x) / out_w);
  const int my_row = out_w <= static_cast<int>(blockDim.x)
                         ? static_cast<int>(p.div_out_w.div(threadIdx.x)) : 0;
  const int my_col = static_cast<int>(threadIdx.x) - my_row * out_w;
  // Pools output rows [oa, ob) of the band from a tile that starts at input row r_lo.
  auto pool = [&](const RowBand& band, int b, int r_lo, int oa, int ob) {
    const int* start_w = starts_of(b);
    const int* start_h = start_w + out_w;
    const T* tile = tile_of(b);
    const int64_t out_base = (static_cast<int64_t>(band.plane) * out_h + band.o_lo) * out_w;
    T* out = static_cast<T*>(a.out) + out_base;
    int64_t* indices = a.indices + out_base;
    if (my_row >= rows_per_pass) return;
    for (int oh = oa + my_row; oh < ob; oh += rows_per_pass) {
      const int h0 = start_h[oh];
      for (int ow = my_col; ow < out_w; ow += blockDim.x) {
        const int w0 = start_w[ow];
        const T* corner = tile + (h0 - r_lo) * in_w + w0;
        WindowMax<C, int> best(h0 * in_w + w0);
#pragma unroll
        for (int dh = 0; dh < kh; ++dh) {
#pragma unroll
          for (int dw = 0; dw < kw; ++dw) {
            best.consider(to_compute(corner[dh * in_w + dw]), (h0 + dh) * in_w + w0 + dw);
          }
        }
        out[oh * out_w + ow] = from_compute<T>(best.value);
        indices[oh * out_w + ow] = best.index;
      }
    }
  };

  // A band's windows are placed kRowStages - 1 iterations ahead and its rows
  // copied from the next iteration on, while the bands before it are pooled.
  // Buffers rotate; a buffer is refilled only after the barrier that ends
  // the pooling that read it. Each iteration commits one copy group (maybe
  // empty), so waiting for all but the newest kRowStages - 2 finds this
  // band's rows.
  const int bands = static_cast<int>(p.bands);  // < 2^31 (plan_row_bands)
  auto band_at = [&](int s) { return blockIdx.x + int64_t{s} * gridDim.x; };
  for (int s = 0; s < kRowStages - 1; ++s) {
    if (band_at(s) < bands) place_windows(locate_band(p, static_cast<int>(band_at(s)), out_h), s);
  }
  __syncthreads();
  for (int s = 0; s < kRowStages - 1; ++s) {
    if (band_at(s) < bands) {
      copy_band(locate_band(p, static_cast<int>(band_at(s)), out_h), s);
    } else {
      cp_async_commit();
    }
  }
  int b = 0;
  for (int i = blockIdx.x; i < bands; i += gridDim.x) {
    const int64_t ahead = i + int64_t{kRowStages - 1} * gridDim.x;
    const int b_ahead = b == 0 ? kRowStages - 1 : b - 1;  // the buffer of the band before
    if (ahead < bands) place_windows(locate_band(p, static_cast<int>(ahead), out_h), b_ahead);
    cp_async_wait<kRowStages - 2>();
    __syncthreads();
    if (ahead < bands) {
      copy_band(locate_band(p, static_cast<int>(ahead), out_h), b_ahead);
    } else {
      cp_async_commit();
    }
    const RowBand band = locate_band(p, i, out_h);
    // Output rows [oa, ob) whose input rows fit the tile: the whole band
    // unless its rows spread wider than planned; then the later pieces are
    // copied here (waiting for the later bands' rows too, which is harmless).
    const int* start_h = starts_of(b) + out_w;
    const bool whole = start_h[band.o_rows - 1] + kh - start_h[0] <= p.tile_rows;
    for (int oa = 0; oa < band.o_rows;) {
      int ob = whole ? band.o_rows : oa + 1;
      while (ob < band.o_rows && start_h[ob] + kh - start_h[oa] <= p.tile_rows) ++ob;
      const int piece_lo = start_h[oa];
      if (oa > 0) {
        __syncthreads();  // the previous piece is pooled
        copy_rows<T>(a, p, plane_input<T>(a, band.plane), piece_lo,
                     start_h[ob - 1] + kh - piece_lo, tile_of(b));
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
      }
      pool(band, b, piece_lo, oa, ob);
      oa = ob;
    }
    __syncthreads();  // buffer b is refilled next iteration
    b = b + 1 == kRowStages ? 0 : b + 1;
  }
}

}  // namespace fmp
}  // namespace baracuda
