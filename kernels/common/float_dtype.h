// The floating-point dtypes the kernels take, and the one dispatch from a
// dtype value to a storage type. No torch headers.
#pragma once

#include <type_traits>

#include "common/status.h"

namespace baracuda {

enum class FloatDtype : int { kFloat16, kBFloat16, kFloat32, kFloat64 };

inline int float_dtype_bytes(FloatDtype dtype) {
  switch (dtype) {
    case FloatDtype::kFloat16:
    case FloatDtype::kBFloat16: return 2;
    case FloatDtype::kFloat32: return 4;
    case FloatDtype::kFloat64: return 8;
  }
  return 0;
}

// Calls fn(T{}) with T the storage type of `dtype`. Half and BFloat16 name the
// caller's 16-bit types (the device's, or c10's in host code); void means the
// caller takes no 16-bit storage (its op layer upcasts those inputs).
template <typename Half, typename BFloat16, typename Fn>
KernelStatus dispatch_float_dtype(FloatDtype dtype, Fn&& fn) {
  switch (dtype) {
    case FloatDtype::kFloat32: return fn(float{});
    case FloatDtype::kFloat64: return fn(double{});
    case FloatDtype::kFloat16:
      if constexpr (std::is_void<Half>::value) {
        return KernelStatus::invalid("float16 inputs are upcast before this kernel");
      } else {
        return fn(Half{});
      }
    case FloatDtype::kBFloat16:
      if constexpr (std::is_void<BFloat16>::value) {
        return KernelStatus::invalid("bfloat16 inputs are upcast before this kernel");
      } else {
        return fn(BFloat16{});
      }
  }
  return KernelStatus::invalid("unknown dtype");
}

}  // namespace baracuda
