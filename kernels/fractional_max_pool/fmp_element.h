// The per-element work of fractional max pooling, shared by the CPU loops and
// the CUDA kernels: one output cell (forward), one input element (backward).
// T: storage type, C: compare / accumulate type (float for half types), A:
// the torch placement's arithmetic (fmp_windows.h), S: stored sample type.
#pragma once

#include <cstdint>

#include "common/acc_convert.h"
#include "common/int_divider.h"
#include "fractional_max_pool/fmp_windows.h"

namespace baracuda {
namespace fmp {

// Splits a linear index of a contiguous [N, C, sizes...] array into the plane
// (n * C + c) and its spatial coordinates. Div: IntDivider for 31-bit indices
// on the GPU, PlainDivider64 otherwise (int_divider.h).
template <int DIMS, typename Index, typename Div>
struct PlaneSplit {
  Div size[DIMS];
  Div channels;

  PlaneSplit(const int64_t* sizes, int64_t c) : channels(make(c)) {
    for (int a = 0; a < DIMS; ++a) size[a] = make(sizes[a]);
  }
  static Div make(int64_t v) {
    if constexpr (sizeof(Index) == 4) {
      return Div(static_cast<uint32_t>(v));
    } else {
      return Div{v};
    }
  }

  BARACUDA_HOST_DEVICE int64_t plane(Index linear, int64_t (&coord)[3]) const {
#pragma unroll
    for (int a = DIMS - 1; a >= 0; --a) {
      const Index q = static_cast<Index>(size[a].div(linear));
      coord[a] = static_cast<int64_t>(linear - q * static_cast<Index>(size[a].divisor));
      linear = q;
    }
    return static_cast<int64_t>(linear);
  }
  BARACUDA_HOST_DEVICE void batch_and_channel(Index plane, int64_t& n, int64_t& c) const {
    const Index q = static_cast<Index>(channels.div(plane));
    n = static_cast<int64_t>(q);
    c = static_cast<int64_t>(plane - q * static_cast<Index>(channels.divisor));
  }
};

// The running maximum of one window, visited in row-major order: NaN wins
// (the last NaN of the window, as torch), ties keep the first maximum, and a
// window of -inf keeps its first element's index. I: the index type (int
// where the caller knows the plane has 31-bit offsets).
template <typename C, typename I = int64_t>
struct WindowMax {
  C value = -static_cast<C>(INFINITY);
  I index;
  BARACUDA_HOST_DEVICE explicit WindowMax(I first) : index(first) {}
  BARACUDA_HOST_DEVICE void consider(C v, I at) {
    if (v > value || v != v) {
      value = v;
      index = at;
    }
  }
};

// Max over the window of output cell `linear` (WindowMax's rules).
// K > 0: every kernel extent is K (a compile-time constant, so the window's
// loads are unrolled and issued together); K == 0: extents read from `a`.
template <int DIMS, int K, typename T, typename C, typename A, typename S, typename Split,
          typename Index>
BARACUDA_HOST_DEVICE inline void pool_one(const FmpForwardArgs& a, const Split& split,
                                          Index linear) {
  const FmpGeometry& g = a.g;
  int64_t o[3] = {0, 0, 0};
  const int64_t plane = split.plane(linear, o);
  const S* samples = static_cast<const S*>(g.samples);
  int64_t lo[3] = {0, 0, 0}, hi[3] = {1, 1, 1}, in[3] = {1, 1, 1}, st[3] = {0, 0, 0};
  constexpr int lead = 3 - DIMS;  // 2-D runs as 3-D with a unit leading axis
#pragma unroll
  for (int ax = 0; ax < DIMS; ++ax) {
    const AxisWindows<A> w(g, samples, plane, ax);
    lo[lead + ax] = w.start(o[ax]);
    hi[lead + ax] = lo[lead + ax] + g.kernel[ax];
    in[lead + ax] = g.in[ax];
    st[lead + ax] = a.x_stride[ax];
  }
  int64_t n, c;
  split.batch_and_channel(static_cast<Index>(plane), n, c);
  const T* x = static_cast<const T*>(a.x) + n * a.x_stride_n + c * a.x_stride_c;
  WindowMax<C> best((lo[0] * in[1] + lo[1]) * in[2] + lo[2]);
  const int64_t ext_t = DIMS == 3 ? (K ? K : hi[0] - lo[0]) : 1;
  const int64_t ext_h = K ? K : hi[1] - lo[1], ext_w = K ? K : hi[2] - lo[2];
  const T* corner = x + lo[0] * st[0] + lo[1] * st[1] + lo[2] * st[2];
#pragma unroll
  for (int64_t dt = 0; dt < ext_t; ++dt) {
#pragma unroll
    for (int64_t dh = 0; dh < ext_h; ++dh) {
      const T* row = corner + dt * st[0] + dh * st[1];
#pragma unroll
      for (int64_t dw = 0; dw < ext_w; ++dw) {
        best.consider(to_acc<C>(row[dw * st[2]]),
                      ((lo[0] + dt) * in[1] + lo[1] + dh) * in[2] + lo[2] + dw);
      }
    }
  }
  static_cast<T*>(a.out)[linear] = from_acc<T>(best.value);
  a.indices[linear] = best.index;
}

// Covering ranges, computed once per (plane, axis, position) rather than
// once per input element (the window arithmetic is conversion-heavy, and an
// input element would redo it for every axis): entry `linear` of the
// [planes, sum(in)] table holds [first, last), the output cells along that
// axis whose window covers the position.
template <typename A, typename S>
BARACUDA_HOST_DEVICE inline void cover_one(const FmpBackwardArgs& a, int64_t linear) {
  const FmpGeometry& g = a.g;
  int64_t sum_in = 0;
  for (int ax = 0; ax < g.dims; ++ax) sum_in += g.in[ax];
  const int64_t plane = linear / sum_in;
  int64_t pos = linear - plane * sum_in;
  int axis = 0;
  while (pos >= g.in[axis]) pos -= g.in[axis++];
  const AxisWindows<A> w(g, static_cast<const S*>(g.samples), plane, axis);
  int64_t first, last;
  w.covering(pos, first, last);
  a.cover[2 * linear] = static_cast<int32_t>(first);
  a.cover[2 * linear + 1] = static_cast<int32_t>(last);
}

// Gradient of input element `linear`: the sum, in output order, of grad_out
// over the cells whose window covers it (from the cover table) and whose
// saved index names it.
template <int DIMS, typename T, typename C, typename Split, typename Index>
BARACUDA_HOST_DEVICE inline void gather_one(const FmpBackwardArgs& a, const Split& split,
                                            Index linear) {
  const FmpGeometry& g = a.g;
  int64_t p[3] = {0, 0, 0};
  const int64_t plane = split.plane(linear, p);
  int64_t first[3] = {0, 0, 0}, last[3] = {1, 1, 1}, gs[3] = {0, 0, 0}, is[3] = {0, 0, 0};
  int64_t flat = 0, axis_offset = 0, sum_in = 0;
#pragma unroll
  for (int ax = 0; ax < DIMS; ++ax) sum_in += g.in[ax];
  constexpr int lead = 3 - DIMS;
#pragma unroll
  for (int ax = 0; ax < DIMS; ++ax) {
    const int32_t* range = a.cover + 2 * (plane * sum_in + axis_offset + p[ax]);
    first[lead + ax] = range[0];
    last[lead + ax] = range[1];
    axis_offset += g.in[ax];
    gs[lead + ax] = a.go_stride[ax];
    is[lead + ax] = a.ix_stride[ax];
    flat = flat * g.in[ax] + p[ax];
  }
  int64_t n, c;
  split.batch_and_channel(static_cast<Index>(plane), n, c);
  const T* go = static_cast<const T*>(a.grad_out) + n * a.go_stride_n + c * a.go_stride_c;
  const int64_t* ix = a.indices + n * a.ix_stride_n + c * a.ix_stride_c;
  C sum = 0;
  for (int64_t t = first[0]; t < last[0]; ++t) {
    for (int64_t h = first[1]; h < last[1]; ++h) {
      for (int64_t w = first[2]; w < last[2]; ++w) {
        if (ix[t * is[0] + h * is[1] + w * is[2]] == flat) {
          sum += to_acc<C>(go[t * gs[0] + h * gs[1] + w * gs[2]]);
        }
      }
    }
  }
  static_cast<T*>(a.grad_in)[linear] = from_acc<T>(sum);
}

}  // namespace fmp
}  // namespace baracuda
