// The one piece of packed-int4 logic shared by the CPU and CUDA kernels:
// rebuild destination byte `b` of a row after writing nibbles
// [start, start + count) from a packed source run.
#pragma once

#include <cstdint>

#include "common/unit_types.h"

namespace baracuda {

BARACUDA_HOST_DEVICE inline uint8_t patch_nibble_byte(uint8_t old_byte, int64_t b,
                                                      int64_t start, int64_t count,
                                                      const uint8_t* src,
                                                      int64_t src_stride) {
  uint32_t byte = old_byte;
  for (int half = 0; half < 2; ++half) {
    const int64_t pos = 2 * b + half;  // nibble index in the destination row
    if (pos < start || pos >= start + count) continue;
    const int64_t q = pos - start;     // nibble index in the source row
    const uint32_t v = (src[(q >> 1) * src_stride] >> (4 * (q & 1))) & 0xFu;
    byte = (byte & ~(0xFu << (4 * half))) | (v << (4 * half));
  }
  return static_cast<uint8_t>(byte);
}

// Destination bytes a row touches: [first, last], or none when count == 0.
BARACUDA_HOST_DEVICE inline int64_t first_nibble_byte(int64_t start) { return start >> 1; }
BARACUDA_HOST_DEVICE inline int64_t last_nibble_byte(int64_t start, int64_t count) {
  return (start + count - 1) >> 1;
}

}  // namespace baracuda
