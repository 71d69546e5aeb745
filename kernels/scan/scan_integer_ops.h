// The integer scans as (load -> state, combine, state -> store) functors, in
// the form of scan_ops.h, for the host engine (scan_cpu.cpp) and the CUDA
// kernel (scan_integer.cu) alike. Elements are widened to int64 on load and
// cut back to their type on store, by a switch on the dtype (the same for
// every element, so it costs a predicted branch, and one kernel serves every
// dtype instead of one per pair).
#pragma once

#include <cstdint>

#include "common/unit_types.h"
#include "scan/scan_integer_kernels.h"

namespace baracuda {
namespace scan {

#define BHD BARACUDA_HOST_DEVICE

// Element `off` of an array of `dtype` as int64: signed types sign-extended,
// unsigned ones and bool zero-extended, uint64 by its bits (torch's cast).
BHD inline int64_t load_integer(const void* p, IntegerDtype dtype, int64_t off) {
  switch (dtype) {
    case IntegerDtype::kBool: return static_cast<const uint8_t*>(p)[off] != 0;
    case IntegerDtype::kUInt8: return static_cast<const uint8_t*>(p)[off];
    case IntegerDtype::kInt8: return static_cast<const int8_t*>(p)[off];
    case IntegerDtype::kInt16: return static_cast<const int16_t*>(p)[off];
    case IntegerDtype::kUInt16: return static_cast<const uint16_t*>(p)[off];
    case IntegerDtype::kInt32: return static_cast<const int32_t*>(p)[off];
    case IntegerDtype::kUInt32: return static_cast<const uint32_t*>(p)[off];
    case IntegerDtype::kInt64: return static_cast<const int64_t*>(p)[off];
    case IntegerDtype::kUInt64:
      return static_cast<int64_t>(static_cast<const uint64_t*>(p)[off]);
  }
  return 0;
}

// Stores the low bits of `v` as element `off` of an array of `dtype` (two's
// complement wrap, as torch's cast); bool stores v != 0.
BHD inline void store_integer(void* p, IntegerDtype dtype, int64_t off, int64_t v) {
  const uint64_t bits = static_cast<uint64_t>(v);
  switch (dtype) {
    case IntegerDtype::kBool: static_cast<uint8_t*>(p)[off] = v != 0; return;
    case IntegerDtype::kUInt8:
    case IntegerDtype::kInt8: static_cast<uint8_t*>(p)[off] = static_cast<uint8_t>(bits); return;
    case IntegerDtype::kInt16:
    case IntegerDtype::kUInt16: static_cast<uint16_t*>(p)[off] = static_cast<uint16_t>(bits); return;
    case IntegerDtype::kInt32:
    case IntegerDtype::kUInt32: static_cast<uint32_t*>(p)[off] = static_cast<uint32_t>(bits); return;
    case IntegerDtype::kInt64:
    case IntegerDtype::kUInt64: static_cast<uint64_t*>(p)[off] = bits; return;
  }
}

// cumsum / cumprod in uint64, where overflow wraps by definition: the same
// bits as torch's wrapping int64 scan.
template <bool kProduct>
struct IntegerArithmeticScan {
  using State = uint64_t;
  const void* x = nullptr;
  void* y = nullptr;
  IntegerDtype x_dtype = IntegerDtype::kInt64;
  IntegerDtype y_dtype = IntegerDtype::kInt64;

  BHD State identity() const { return kProduct ? 1 : 0; }
  BHD State combine(State a, State b) const { return kProduct ? a * b : a + b; }
  BHD State load(int64_t off, int64_t) const {
    return static_cast<uint64_t>(load_integer(x, x_dtype, off));
  }
  BHD void store(int64_t off, int64_t, State s) const {
    store_integer(y, y_dtype, off, static_cast<int64_t>(s));
  }
};

// The extreme of a run and its position; index -1 marks the empty run.
struct IntegerExtremeState {
  int64_t value;
  int64_t index;
};

// cummax / cummin. combine(a, b) takes b, the later run in scan order, on a
// tie: torch's later element wins, and with reverse=True (flip, scan, flip)
// the later element in scan order is the earlier one in memory. Choosing by
// (value, scan order) is a maximum under a total order, so associative.
template <bool kMax>
struct IntegerExtremeScan {
  using State = IntegerExtremeState;
  const void* x = nullptr;
  void* y = nullptr;
  int64_t* indices = nullptr;
  IntegerDtype dtype = IntegerDtype::kInt64;

  BHD State identity() const { return {0, -1}; }
  BHD State combine(State a, State b) const {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    const bool later_wins = kMax ? b.value >= a.value : b.value <= a.value;
    return later_wins ? b : a;
  }
  BHD State load(int64_t off, int64_t l) const { return {load_integer(x, dtype, off), l}; }
  BHD void store(int64_t off, int64_t, State s) const {
    store_integer(y, dtype, off, s.value);
    indices[off] = s.index;
  }
};

// run(op, reverse) with the functor of a.kind; an error status for a kind
// without an integer form (logcumsumexp).
template <typename Run>
KernelStatus dispatch_integer_scan(const IntegerScanArgs& a, Run&& run) {
  auto arithmetic = [&](auto op) {
    op.x = a.x; op.y = a.y; op.x_dtype = a.x_dtype; op.y_dtype = a.y_dtype;
    return run(op, a.reverse);
  };
  auto extreme = [&](auto op) {
    op.x = a.x; op.y = a.y; op.indices = a.indices; op.dtype = a.x_dtype;
    return run(op, a.reverse);
  };
  switch (a.kind) {
    case ScanKind::kCumsum: return arithmetic(IntegerArithmeticScan<false>{});
    case ScanKind::kCumprod: return arithmetic(IntegerArithmeticScan<true>{});
    case ScanKind::kCummax: return extreme(IntegerExtremeScan<true>{});
    case ScanKind::kCummin: return extreme(IntegerExtremeScan<false>{});
    case ScanKind::kLogcumsumexp:
    case ScanKind::kLinear: break;
  }
  return KernelStatus::invalid("this scan kind has no integer form");
}

#undef BHD

}  // namespace scan
}  // namespace baracuda
