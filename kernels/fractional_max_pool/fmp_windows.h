// Where each pooling window starts, per axis and plane; host and device.
//
// "torch" placement (bit-identical to PyTorch's, given the same samples u):
//   start(o) = in - k                                   for the last cell
//   start(o) = int((o + u) * alpha) - int(u * alpha)     otherwise
// with alpha = (in - k) / (out - 1), every operation rounded in the
// arithmetic type A that PyTorch uses: float32 (float64 for float64 inputs) on
// CUDA, the input's own type on CPU (its half types round after every step).
//
// "even" placement (evenly spaced base plus the plane's perturbation, in
// float64): start(o) = clamp(floor(o * (in - k) / (out - 1) + u), 0, in - k),
// and floor(u * (in - k)) when out == 1.
//
// Both are nondecreasing in o, which the backward's window search relies on.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/unit_types.h"
#include "fractional_max_pool/fmp_kernels.h"

namespace baracuda {
namespace fmp {

// A value of the placement arithmetic as a number of its own width: float64
// stays float64; float32 and the host half types go through float32 (exact).
template <typename A>
BARACUDA_HOST_DEVICE inline auto widen(A v) {
  if constexpr (sizeof(A) == 8) {
    return static_cast<double>(v);
  } else {
    return static_cast<float>(v);
  }
}

template <typename A>
BARACUDA_HOST_DEVICE inline int64_t torch_start(A u, A alpha, int64_t o, int64_t in, int64_t out,
                                                int64_t k) {
  if (o == out - 1) return in - k;
  return static_cast<int64_t>(widen<A>((static_cast<A>(o) + u) * alpha)) -
         static_cast<int64_t>(widen<A>(u * alpha));
}

BARACUDA_HOST_DEVICE inline int64_t even_start(double u, int64_t o, int64_t in, int64_t out,
                                               int64_t k) {
  const int64_t span = in - k;
  const double pos = out == 1 ? u * static_cast<double>(span)
                              : static_cast<double>(o) * static_cast<double>(span) /
                                        static_cast<double>(out - 1) + u;
  const int64_t s = static_cast<int64_t>(floor(pos));
  return s < 0 ? 0 : (s > span ? span : s);
}

// The mean distance between consecutive window starts, (in - k) / (out - 1)
// (0 for a single window): the planners and the window search estimate from it.
BARACUDA_HOST_DEVICE inline double window_step(int64_t in, int64_t out, int64_t k) {
  return out > 1 ? static_cast<double>(in - k) / static_cast<double>(out - 1) : 0.0;
}

// The window starts of one plane along one axis. A: the torch placement's
// arithmetic; S: the stored sample type (float or double).
template <typename A>
struct AxisWindows {
  A u, alpha;
  double u_even;
  int64_t in, out, k;
  bool even;

  template <typename S>
  BARACUDA_HOST_DEVICE AxisWindows(const FmpGeometry& g, const S* samples, int64_t plane,
                                   int axis)
      : in(g.in[axis]), out(g.out[axis]), k(g.kernel[axis]), even(g.even) {
    const S s = samples[plane * g.dims + g.sample_index[axis]];
    u_even = static_cast<double>(s);
    if constexpr (sizeof(A) == 8) {
      u = static_cast<A>(s);
      alpha = static_cast<A>(g.alpha[axis]);
    } else {
      u = static_cast<A>(static_cast<float>(s));
      alpha = static_cast<A>(static_cast<float>(g.alpha[axis]));
    }
  }

  BARACUDA_HOST_DEVICE int64_t start(int64_t o) const {
    return even ? even_start(u_even, o, in, out, k) : torch_start<A>(u, alpha, o, in, out, k);
  }

  // The output cells whose window covers input position p: [first, last).
  // Windows start about o * (in - k) / (out - 1) (both placements, give or
  // take one), so a guess from that lands within a step or two of the first
  // covering cell, and the exact answer is found by stepping from there.
  BARACUDA_HOST_DEVICE void covering(int64_t p, int64_t& first, int64_t& last) const {
    int64_t o = 0;
    if (out > 1 && in > k) {
      o = static_cast<int64_t>(static_cast<double>(p - k + 1) / window_step(in, out, k));
      o = o < 0 ? 0 : (o > out - 1 ? out - 1 : o);
    }
    while (o > 0 && start(o - 1) + k > p) --o;   // first o with start(o) + k > p
    while (o < out && start(o) + k <= p) ++o;
    first = o;
    last = o;
    while (last < out && start(last) <= p) ++last;
  }
};

}  // namespace fmp
}  // namespace baracuda
