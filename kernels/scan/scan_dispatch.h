// From launch arguments to a concrete (load, combine, store) functor, once for
// both engines: `run(op, scan_reverse)` is the engine (CPU loop or CUDA
// kernels). Half and BFloat16 are the device's half types; the host engine
// passes void for both and is never handed half data (the op layer upcasts).
// Float32Acc accumulates float32 data: float on the device, whose tree-shaped
// scan rounds little; double on the host, whose sequential walk would
// otherwise round once per element (torch's CPU scans do the same).
#pragma once

#include <cstdint>
#include <type_traits>

#include "scan/scan_kernels.h"
#include "scan/scan_ops.h"

namespace baracuda {
namespace scan {

// Calls go(Pos{}) with the narrowest position type the axis fits in.
template <typename Go>
KernelStatus with_position_type(const ScanShape& s, Go&& go) {
  if (s.len <= INT32_MAX) return go(int32_t{});
  return go(int64_t{});
}

template <typename T, typename Acc, typename Run>
KernelStatus forward_for(const ScanForwardArgs& a, Run&& run) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  auto plain = [&](auto op) {
    op.src = x;
    op.dst = y;
    return run(op, a.reverse);
  };
  switch (a.kind) {
    case ScanKind::kCumsum: return plain(PlainForward<T, Acc, SumCombine>{});
    case ScanKind::kCumprod: return plain(PlainForward<T, Acc, ProdCombine>{});
    case ScanKind::kLogcumsumexp: return plain(LogcumsumexpForward<T, Acc>{});
    case ScanKind::kLinear: {
      LinearScanForward<T, Acc> op;
      op.a = x;
      op.b = static_cast<const T*>(a.b);
      op.h = y;
      return run(op, a.reverse);
    }
    case ScanKind::kCummax:
    case ScanKind::kCummin:
      return with_position_type(a.shape, [&](auto pos) {
        using Pos = decltype(pos);
        auto extreme = [&](auto op) {
          op.x = x; op.y = y; op.indices = a.indices;
          return run(op, a.reverse);
        };
        if (a.kind == ScanKind::kCummax) return extreme(ExtremeForward<T, Acc, Pos, true>{});
        return extreme(ExtremeForward<T, Acc, Pos, false>{});
      });
  }
  return KernelStatus::invalid("unknown scan kind");
}

// A backward op that reads its neighbours (cumprod's and linear_scan's),
// with the saved tensors and the axis it walks against the forward.
template <typename Op, typename T>
Op with_neighbors(Op op, const GradWithSaved<T>& saved, const ScanBackwardArgs& a) {
  static_cast<GradWithSaved<T>&>(op) = saved;
  op.len = a.shape.len;
  op.scan_reverse = !a.reverse;
  op.scan_step = a.reverse ? a.shape.inner : -a.shape.inner;
  return op;
}

// Every backward scan runs against the forward direction.
template <typename T, typename Acc, typename Run>
KernelStatus backward_for(const ScanBackwardArgs& a, Run&& run) {
  const GradWithSaved<T> saved{static_cast<const T*>(a.dy), static_cast<const T*>(a.x),
                               static_cast<const T*>(a.y), static_cast<T*>(a.dx)};
  const bool back = !a.reverse;
  switch (a.kind) {
    case ScanKind::kCumsum:
      return KernelStatus::invalid("scan: cumsum's backward runs as a cumsum (reverse_cumsum_of)");
    case ScanKind::kCumprod: return run(with_neighbors(CumprodBackward<T, Acc>{}, saved, a), back);
    case ScanKind::kLinear: {
      LinearScanBackward<T, Acc> op = with_neighbors(LinearScanBackward<T, Acc>{}, saved, a);
      op.db = static_cast<T*>(a.db);
      return run(op, back);
    }
    case ScanKind::kLogcumsumexp: {
      LogcumsumexpBackward<T, Acc> op;
      static_cast<GradWithSaved<T>&>(op) = saved;
      return run(op, back);
    }
    case ScanKind::kCummax:
    case ScanKind::kCummin:
      return with_position_type(a.shape, [&](auto pos) {
        ExtremeBackward<T, Acc, decltype(pos)> op;
        op.dy = saved.dy; op.indices = a.indices; op.dx = saved.dx;
        return run(op, back);
      });
  }
  return KernelStatus::invalid("unknown scan kind");
}

// What storage type T accumulates in: float64 in float64, float32 in
// Float32Acc, the half types in float32.
template <typename T, typename Float32Acc>
using AccumulatorOf = std::conditional_t<
    std::is_same<T, double>::value, double,
    std::conditional_t<std::is_same<T, float>::value, Float32Acc, float>>;

// The forward or backward scan of storage type T, by the arguments' type.
template <typename T, typename Acc, typename Args, typename Run>
KernelStatus scan_for(const Args& a, Run&& run) {
  if constexpr (std::is_same<Args, ScanForwardArgs>::value) {
    return forward_for<T, Acc>(a, run);
  } else {
    return backward_for<T, Acc>(a, run);
  }
}

template <typename Half, typename BFloat16, typename Float32Acc, typename Args, typename Run>
KernelStatus dispatch_scan(const Args& a, Run&& run) {
  return dispatch_float_dtype<Half, BFloat16>(a.dtype, [&](auto storage) {
    using T = decltype(storage);
    return scan_for<T, AccumulatorOf<T, Float32Acc>>(a, run);
  });
}

}  // namespace scan
}  // namespace baracuda
