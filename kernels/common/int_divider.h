// Division by a run-time constant without a hardware divide: the divisor is
// turned once, on the host, into a multiplier and a shift, and each quotient
// costs a multiply-high, an add and a shift. Exact for dividends below 2^31,
// which is why index math uses it only when every index fits in 31 bits.
#pragma once

#include <cstdint>

#include "common/unit_types.h"

namespace baracuda {

struct IntDivider {
  uint32_t divisor = 1;
  uint32_t magic = 0;
  uint32_t shift = 0;

  IntDivider() = default;
  explicit IntDivider(uint32_t d) : divisor(d) {
    // shift = ceil(log2(d)); magic = floor(2^32 * (2^shift - d) / d) + 1.
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
    const uint64_t two_pow_shift = uint64_t{1} << shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * (two_pow_shift - d)) / d + 1);
  }

  BARACUDA_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

// 64-bit counterpart of IntDivider, for problems too large for 31-bit indices
// (and for host loops, where a divide is cheap enough).
struct PlainDivider64 {
  int64_t divisor = 1;
  BARACUDA_HOST_DEVICE int64_t div(int64_t n) const { return n / divisor; }
};

}  // namespace baracuda
