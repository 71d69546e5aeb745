// Host executors of fractional max pooling: the shared per-element code
// (fmp_element.h) over plain loops. The torch placement computes its windows
// in the input's own type, as PyTorch's CPU kernels do (its half types round
// after every step), so half inputs are read as c10's half types here.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

#include "fractional_max_pool/fmp_element.h"
#include "fractional_max_pool/fmp_kernels.h"

namespace baracuda {
namespace {

// Compare / accumulate type: float64 for float64, float32 otherwise.
template <typename T>
using compute_of = std::conditional_t<std::is_same<T, double>::value, double, float>;

template <int DIMS>
using HostSplit = fmp::PlaneSplit<DIMS, int64_t, PlainDivider64>;

}  // namespace

KernelStatus fmp_forward_cpu(const FmpForwardArgs& a) {
  const int64_t total = fmp_elements(a.g, a.g.out);
  return fmp_dispatch_dims(a.g.dims, [&](auto dims_c) {
    constexpr int D = decltype(dims_c)::value;
    const HostSplit<D> split(a.g.out, a.g.channels);
    return dispatch_float_dtype<c10::Half, c10::BFloat16>(a.g.dtype, [&](auto t) {
      using T = decltype(t);
      using C = compute_of<T>;
      for (int64_t i = 0; i < total; ++i) fmp::pool_one<D, 0, T, C, T, C>(a, split, i);
      return KernelStatus::ok();
    });
  });
}

KernelStatus fmp_backward_cpu(const FmpBackwardArgs& a) {
  const int64_t total = fmp_elements(a.g, a.g.in);
  return fmp_dispatch_dims(a.g.dims, [&](auto dims_c) {
    constexpr int D = decltype(dims_c)::value;
    const HostSplit<D> split(a.g.in, a.g.channels);
    return dispatch_float_dtype<c10::Half, c10::BFloat16>(a.g.dtype, [&](auto t) {
      using T = decltype(t);
      using C = compute_of<T>;
      const int64_t entries = fmp_cover_entries(a.g);
      for (int64_t i = 0; i < entries; ++i) fmp::cover_one<T, C>(a, i);
      for (int64_t i = 0; i < total; ++i) fmp::gather_one<D, T, C>(a, split, i);
      return KernelStatus::ok();
    });
  });
}

}  // namespace baracuda
