// Byte-width dispatch. Copy-like kernels never look at values, so every dtype
// of a given size shares one instantiation: a "unit" is an opaque type of
// 1, 2, 4, 8 or 16 bytes. The 16-byte unit is also how wide vector accesses
// are expressed: a run of small elements is re-read as fewer 16-byte units.
#pragma once

#include <cstdint>
#include <utility>

#include "common/status.h"

#if defined(__CUDACC__)
#define BARACUDA_HOST_DEVICE __host__ __device__
#else
#define BARACUDA_HOST_DEVICE
#endif

namespace baracuda {

struct alignas(16) Unit16 {
  uint64_t lo, hi;
};

template <int Bytes>
struct UnitOf;
template <> struct UnitOf<1> { using type = uint8_t; };
template <> struct UnitOf<2> { using type = uint16_t; };
template <> struct UnitOf<4> { using type = uint32_t; };
template <> struct UnitOf<8> { using type = uint64_t; };
template <> struct UnitOf<16> { using type = Unit16; };

template <int Bytes>
using unit_t = typename UnitOf<Bytes>::type;

// Calls fn(std::integral_constant<int, W>{}) for the runtime width W.
template <typename Fn>
KernelStatus dispatch_unit_width(int bytes, Fn&& fn) {
  switch (bytes) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 8: return fn(std::integral_constant<int, 8>{});
    case 16: return fn(std::integral_constant<int, 16>{});
    default: return KernelStatus::invalid("unit width must be 1, 2, 4, 8 or 16 bytes");
  }
}

}  // namespace baracuda
