// Deterministic fractional-max-pool backward over bands of an input plane
// (no atomics, no per-element search).
//
// A block owns a band of rows along the plane's outermost spatial axis (all
// of the inner axes). It works out which output cells cover each row and
// column of the band (the cover ranges, from the plane's window placement),
// zeroes the band's accumulators, and then visits every output cell whose
// window reaches into it. Several cells may name the same input element;
// they all cover it, so a cell finds the others among the few cells covering
// its element. The first of them in output order -- the leader -- adds their
// gradients up in output order and writes the element; the others write
// nothing. That is the sum the per-element gather of fmp_element.h computes,
// in the same order, and no element is written by two threads.
//
// When they fit, the band's accumulators and its cells (index and gradient)
// sit in shared memory: a leader then looks its neighbours up there, and the
// band leaves in one coalesced pass. Otherwise the same steps run on global
// memory (the band of grad_in is zeroed first and leaders write into it).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/compute_types.cuh"
#include "common/cuda_launch.cuh"
#include "common/int_divider.h"
#include "fractional_max_pool/fmp_windows.h"
#include "fractional_max_pool/fmp_kernels.h"

namespace baracuda {
namespace fmp {

// "Row": one position of the outermost axis with all inner axes (a line in
// 2-D, a slice in 3-D). Fixed on the host.
struct BandPlan {
  int64_t bands_per_plane = 0;
  int band_rows = 0;                 // rows per block (the last band may be short)
  int inner_in = 0, inner_out = 0;   // elements of one input / output row
  int plane_in = 0;                  // elements of one input plane
  int inner_cover = 0;               // cover ranges of the inner axes
  int cell_capacity = 0;             // cells staged in shared memory (0: none)
  bool staged = false;               // accumulate the band in shared memory
  IntDivider div_inner_in, div_inner_out, div_in_w, div_out_w;  // w: innermost axis
  size_t smem_bytes = 0;
};

constexpr int kBandThreads = 256;
// Input elements an unstaged band aims for: a few dozen per thread.
constexpr int64_t kBandElements = 16384;
// Enough blocks to fill the GPU several times over.
constexpr int64_t kBandTargetBlocks = 1024;
// Under the 48 KiB a block gets without opting in.
constexpr size_t kBandSmemBudget = 46 * 1024;

BARACUDA_HOST_DEVICE inline size_t round16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// Shared memory of one band: accumulators, cell gradients, cell indices
// (each padded to 16 bytes), then the cover ranges.
struct BandSmem {
  size_t stage = 0, cell_grad = 0, cell_target = 0, cover = 0;
  BARACUDA_HOST_DEVICE size_t total() const { return stage + cell_grad + cell_target + cover; }
};

BARACUDA_HOST_DEVICE inline BandSmem band_smem(int64_t rows, int64_t inner_in, int64_t inner_cover, int64_t cells,
                          bool staged, size_t compute_bytes) {
  BandSmem m;
  m.stage = staged ? round16(static_cast<size_t>(rows * inner_in) * compute_bytes) : 0;
  m.cell_grad = round16(static_cast<size_t>(cells) * compute_bytes);
  m.cell_target = round16(static_cast<size_t>(cells) * sizeof(int32_t));
  m.cover = 2 * sizeof(int32_t) * static_cast<size_t>(rows + inner_cover);
  return m;
}

// Output rows whose windows can reach into `rows` consecutive input rows.
// Their starts lie in an interval of rows + k - 1 positions; m + 1
// consecutive starts are at least floor(m * step) - 1 apart (the placement
// rounds each start down once), so at most ceil((rows + k) / step) of them
// fit, plus the last window, which may sit closer to its neighbour. (Should
// rounding ever beat this, the block leaves its cells in global memory.)
inline int64_t band_out_rows_bound(const FmpGeometry& g, int64_t rows) {
  if (g.out[0] <= 1) return 1;
  const double step = window_step(g.in[0], g.out[0], g.kernel[0]);  // >= 1
  const auto fit = static_cast<int64_t>(std::ceil(static_cast<double>(rows + g.kernel[0]) / step));
  return std::min<int64_t>(g.out[0], fit + 1);
}

// False when the band kernel does not apply (planes past 31-bit offsets, or
// inner axes too long for their cover ranges to sit in shared memory); the
// caller then runs the per-element gather over a global cover table.
inline bool plan_bands(const FmpGeometry& g, size_t compute_bytes, BandPlan& p) {
  int64_t inner_in = 1, inner_out = 1, inner_cover = 0;
  for (int ax = 1; ax < g.dims; ++ax) {
    inner_in *= g.in[ax];
    inner_out *= g.out[ax];
    inner_cover += g.in[ax];
  }
  const int64_t planes = std::max<int64_t>(1, g.batch * g.channels);
  if (inner_in * g.in[0] >= (int64_t{1} << 31) || inner_out * g.out[0] >= (int64_t{1} << 31)) {
    return false;
  }
  const int64_t wanted_bands = ceil_div(kBandTargetBlocks, planes);
  const int64_t max_rows = ceil_div(g.in[0], std::min(wanted_bands, g.in[0]));
  auto smem = [&](int64_t rows, bool staged, bool cells) {
    const int64_t n = cells ? band_out_rows_bound(g, rows) * inner_out : 0;
    return band_smem(rows, inner_in, inner_cover, n, staged, compute_bytes).total();
  };
  // Cells are worth staging only where windows overlap (a leader then looks
  // at its neighbours); disjoint windows leave each element one cell.
  bool overlap = false;
  for (int ax = 0; ax < g.dims; ++ax) {
    if (g.out[ax] <= 1) continue;
    const double step = window_step(g.in[ax], g.out[ax], g.kernel[ax]);
    overlap = overlap || static_cast<double>(g.kernel[ax]) > std::floor(step);
  }
  // Most rows with everything staged; else accumulators only; else nothing.
  int64_t rows = max_rows;
  bool staged = true, cells = overlap;
  while (rows > 1 && smem(rows, true, cells) > kBandSmemBudget) --rows;
  if (smem(rows, true, cells) > kBandSmemBudget) {
    cells = false;
    rows = max_rows;
    while (rows > 1 && smem(rows, true, false) > kBandSmemBudget) --rows;
    if (smem(rows, true, false) > kBandSmemBudget) {
      staged = false;
      rows = std::max<int64_t>(1, std::min(max_rows, kBandElements / inner_in));
    }
  }
  const int64_t bands = ceil_div(g.in[0], rows);
  rows = ceil_div(g.in[0], bands);  // equal bands, same count
  if (smem(rows, staged, cells) > kBandSmemBudget || planes * bands >= (int64_t{1} << 31)) {
    return false;
  }
  p.band_rows = static_cast<int>(rows);
  p.bands_per_plane = bands;
  p.inner_in = static_cast<int>(inner_in);
  p.inner_out = static_cast<int>(inner_out);
  p.plane_in = static_cast<int>(inner_in * g.in[0]);
  p.inner_cover = static_cast<int>(inner_cover);
  p.cell_capacity = cells ? static_cast<int>(band_out_rows_bound(g, rows) * inner_out) : 0;
  p.staged = staged;
  p.div_inner_in = IntDivider(static_cast<uint32_t>(inner_in));
  p.div_inner_out = IntDivider(static_cast<uint32_t>(inner_out));
  p.div_in_w = IntDivider(static_cast<uint32_t>(g.in[g.dims - 1]));
  p.div_out_w = IntDivider(static_cast<uint32_t>(g.out[g.dims - 1]));
  p.smem_bytes = smem(rows, staged, cells);
  return true;
}

// Coordinates along the inner axes of an offset inside a row.
template <int DIMS>
__device__ inline void split_inner(uint32_t r, const IntDivider& div_w, int (&c)[2]) {
  if constexpr (DIMS == 3) {
    const uint32_t h = div_w.div(r);
    c[0] = static_cast<int>(h);
    c[1] = static_cast<int>(r - h * div_w.divisor);
  } else {
    c[0] = static_cast<int>(r);
    c[1] = 0;
  }
}

constexpr int kBandCellsInFlight = 4;

template <int DIMS, bool STAGED, typename T>
__global__ void __launch_bounds__(kBandThreads)
fmp_band_backward_kernel(FmpBackwardArgs a, BandPlan p) {
  using C = compute_t<T>;
  const FmpGeometry& g = a.g;
  // 32-bit: the grid has fewer than 2^31 blocks (plan_bands).
  const int bands_per_plane = static_cast<int>(p.bands_per_plane);
  const int64_t plane = static_cast<int>(blockIdx.x) / bands_per_plane;
  const int row_lo = (static_cast<int>(blockIdx.x) - static_cast<int>(plane) * bands_per_plane) *
                     p.band_rows;
  const int rows = min(p.band_rows, static_cast<int>(g.in[0]) - row_lo);
  const int band_elems = rows * p.inner_in;
  const int64_t band_offset = static_cast<int64_t>(row_lo) * p.inner_in;
  T* dst = static_cast<T*>(a.grad_in) + plane * p.plane_in + band_offset;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const BandSmem layout = band_smem(p.band_rows, p.inner_in, p.inner_cover, p.cell_capacity,
                                    STAGED, sizeof(C));
  C* stage = reinterpret_cast<C*>(smem_raw);
  C* cell_grad = reinterpret_cast<C*>(smem_raw + layout.stage);
  int* cell_target = reinterpret_cast<int*>(smem_raw + layout.stage + layout.cell_grad);
  int2* band_cover = reinterpret_cast<int2*>(smem_raw + layout.stage + layout.cell_grad +
                                             layout.cell_target);
  int2* inner_cover = band_cover + p.band_rows;

  // Cover ranges of the band's rows and of every inner position; zeroes.
  {
    const C* samples = static_cast<const C*>(g.samples);
    for (int i = threadIdx.x; i < rows + p.inner_cover; i += blockDim.x) {
      int axis = 0, pos = row_lo + i;
      if (i >= rows) {
        pos = i - rows;
        axis = 1;
        if (DIMS == 3 && pos >= g.in[1]) {
          pos -= static_cast<int>(g.in[1]);
          axis = 2;
        }
      }
      int64_t first, last;
      AxisWindows<C>(g, samples, plane, axis).covering(pos, first, last);
      (i < rows ? band_cover[i] : inner_cover[i - rows]) =
          make_int2(static_cast<int>(first), static_cast<int>(last));
    }
    if constexpr (STAGED) {
      // The whole (16-byte padded) accumulator area, 16 bytes at a time.
      for (size_t v = threadIdx.x; v < layout.stage / 16; v += blockDim.x) {
        reinterpret_cast<Pack<C, 16 / sizeof(C)>*>(stage)[v] = Pack<C, 16 / sizeof(C)>{};
      }
    } else {
      for (int e = threadIdx.x; e < band_elems; e += blockDim.x) dst[e] = from_compute<T>(C(0));
    }
  }
  __syncthreads();  // also orders the zeroes before the leaders' writes

  const int64_t n = plane / g.channels, c = plane - n * g.channels;
  const T* go = static_cast<const T*>(a.grad_out) + n * a.go_stride_n + c * a.go_stride_c;
  const int64_t* ix = a.indices + n * a.ix_stride_n + c * a.ix_stride_c;
  auto offset = [](const int64_t* stride, const int (&o)[3]) {
    int64_t off = o[0] * stride[0] + o[1] * stride[1];
    if constexpr (DIMS == 3) off += o[2] * stride[2];
    return off;
  };
  // Output cells along the outer axis whose windows reach into the band.
  const int o_first = band_cover[0].x;
  const int cells = (band_cover[rows - 1].y - o_first) * p.inner_out;
  const bool cells_staged = cells <= p.cell_capacity;
  auto cell_of = [&](int j, int (&o)[3]) {
    const uint32_t o_rel = p.div_inner_out.div(static_cast<uint32_t>(j));
    int oi[2];
    split_inner<DIMS>(static_cast<uint32_t>(j) - o_rel * p.div_inner_out.divisor, p.div_out_w, oi);
    o[0] = o_first + static_cast<int>(o_rel);
    o[1] = oi[0];
    o[2] = oi[1];
  };
  auto cell_index = [&](const int (&o)[3]) {
    return (o[0] - o_first) * p.inner_out +
           (DIMS == 3 ? o[1] * static_cast<int>(g.out[2]) + o[2] : o[1]);
  };
  // The saved index relative to the band; -1 (no element of the band) when
  // it names nothing in the plane.
  auto band_target = [&](int64_t saved) {
    const int64_t local = saved - band_offset;
    return saved >= 0 && saved < p.plane_in && local >= 0 && local < band_elems
               ? static_cast<int>(local) : -1;
  };
  // Cell o names band element `local`. If its window covers the element and
  // no cell before it in output order names the element too, it sums every
  // cell that does (in output order) and writes the element.
  // unrolled: visit the covering cells in a fixed pattern when ranges are
  // short (cells in shared memory; with global look-ups the copies of that
  // code inlined per cell in flight cost more registers than they save).
  auto lead = [&](const int (&o)[3], int local, C own_grad, auto&& target_of, auto&& grad_of,
                  auto unrolled) {
    const int r = static_cast<int>(p.div_inner_in.div(static_cast<uint32_t>(local)));
    int q[2];
    split_inner<DIMS>(static_cast<uint32_t>(local - r * p.inner_in), p.div_in_w, q);
    const int2 c0 = band_cover[r], c1 = inner_cover[q[0]];
    const int2 c2 = DIMS == 3 ? inner_cover[g.in[1] + q[1]] : make_int2(0, 1);
    if (o[0] < c0.x || o[0] >= c0.y || o[1] < c1.x || o[1] >= c1.y ||
        (DIMS == 3 && (o[2] < c2.x || o[2] >= c2.y))) {
      return;
    }
    // The covering cells in output order. Usually each axis has one or two
    // (windows overlap at most twice), and a fixed 2 x 2 (x 2) visit costs
    // far less than a loop.
    C sum = 0;
    bool self_seen = false;
    auto visit = [&](const int (&other)[3]) {  // false: an earlier cell leads
      if (other[0] == o[0] && other[1] == o[1] && other[2] == o[2]) {
        self_seen = true;
        sum += own_grad;
      } else if (target_of(other) == local) {
        if (!self_seen) return false;
        sum += grad_of(other);
      }
      return true;
    };
    const int n0 = c0.y - c0.x, n1 = c1.y - c1.x, n2 = c2.y - c2.x;
    if (decltype(unrolled)::value && n0 <= 2 && n1 <= 2 && n2 <= 2) {
      bool leads = true;
#pragma unroll
      for (int d0 = 0; d0 < 2; ++d0) {
#pragma unroll
        for (int d1 = 0; d1 < 2; ++d1) {
#pragma unroll
          for (int d2 = 0; d2 < (DIMS == 3 ? 2 : 1); ++d2) {
            if (leads && d0 < n0 && d1 < n1 && d2 < n2) {
              leads = visit({c0.x + d0, c1.x + d1, c2.x + d2});
            }
          }
        }
      }
      if (!leads) return;
    } else {
      int other[3] = {c0.x, c1.x, c2.x};
      for (int t = n0 * n1 * n2; t > 0; --t) {
        if (!visit(other)) return;
        if (DIMS == 3 && ++other[2] < c2.y) continue;
        other[2] = c2.x;
        if (++other[1] < c1.y) continue;
        other[1] = c1.x;
        ++other[0];
      }
    }
    if constexpr (STAGED) {
      stage[local] = sum;
    } else {
      dst[local] = from_compute<T>(sum);
    }
  };

  for (int j0 = 0; j0 < cells; j0 += kBandCellsInFlight * blockDim.x) {
    int64_t saved[kBandCellsInFlight];
    C grad[kBandCellsInFlight];
#pragma unroll
    for (int b = 0; b < kBandCellsInFlight; ++b) {
      const int j = j0 + b * blockDim.x + threadIdx.x;
      if (j >= cells) continue;
      int o[3];
      cell_of(j, o);
      saved[b] = ix[offset(a.ix_stride, o)];
      grad[b] = to_compute(go[offset(a.go_stride, o)]);
    }
#pragma unroll
    for (int b = 0; b < kBandCellsInFlight; ++b) {
      const int j = j0 + b * blockDim.x + threadIdx.x;
      if (j >= cells) continue;
      const int local = band_target(saved[b]);
      if (cells_staged) {
        cell_target[j] = local;
        cell_grad[j] = grad[b];
      } else if (local >= 0) {
        int o[3];
        cell_of(j, o);
        lead(o, local, grad[b], [&](const int (&x)[3]) { return band_target(ix[offset(a.ix_stride, x)]); },
             [&](const int (&x)[3]) { return to_compute(go[offset(a.go_stride, x)]); },
             std::false_type{});
      }
    }
  }
  if (cells_staged) {
    __syncthreads();
    for (int j = threadIdx.x; j < cells; j += blockDim.x) {
      const int local = cell_target[j];
      if (local < 0) continue;
      int o[3];
      cell_of(j, o);
      lead(o, local, cell_grad[j], [&](const int (&x)[3]) { return cell_target[cell_index(x)]; },
           [&](const int (&x)[3]) { return cell_grad[cell_index(x)]; }, std::true_type{});
    }
  }
  if constexpr (STAGED) {
    __syncthreads();
    // 16-byte stores when the band is aligned (grad_in is contiguous, so
    // usually), else one element at a time.
    constexpr int kVec = 16 / sizeof(T), kChunk = 16 / sizeof(C);  // elements per 16 bytes
    if (band_elems % kVec == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
      for (int v = threadIdx.x; v < band_elems / kVec; v += blockDim.x) {
        Pack<T, kVec> out;
#pragma unroll
        for (int c = 0; c < kVec / kChunk; ++c) {
          const Pack<C, kChunk> sum = reinterpret_cast<const Pack<C, kChunk>*>(stage + v * kVec)[c];
#pragma unroll
          for (int e = 0; e < kChunk; ++e) out.x[c * kChunk + e] = from_compute<T>(sum.x[e]);
        }
        reinterpret_cast<Pack<T, kVec>*>(dst)[v] = out;
      }
    } else {
      for (int e = threadIdx.x; e < band_elems; e += blockDim.x) dst[e] = from_compute<T>(stage[e]);
    }
  }
}

}  // namespace fmp
}  // namespace baracuda
