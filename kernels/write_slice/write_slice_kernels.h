// Launchers of the write_slice family, over raw pointers and plain structs.
// No torch headers: the op layer (write_slice_op.cpp) validates, plans and
// then calls one of these with everything already in canonical form.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "common/strided_layout.h"
#include "common/unit_types.h"

namespace baracuda {

// Independent rows of the same strided copy. A row may carry a run-time
// offset read from memory (write_slice_at_): the row's destination base
// moves by offset * offset_dst_stride, and a row whose offset falls outside
// [0, offset_limit] writes nothing. Reading the offset on the device is what
// lets a captured CUDA graph append at a new position every replay.
struct RowSpec {
  int64_t count = 1;
  int64_t dst_stride = 0;  // in units (bytes for the nibble kernel)
  int64_t src_stride = 0;
  const int64_t* offsets = nullptr;  // nullptr: no run-time offset
  bool offset_per_row = false;       // offsets[row] rather than offsets[0]
  int64_t offset_dst_stride = 0;
  int64_t offset_limit = 0;
};

// The run-time offset of row r (0 when there is none); false when the row
// must be skipped because the offset would write out of bounds.
BARACUDA_HOST_DEVICE inline bool resolve_row_offset(const RowSpec& rows, int64_t r,
                                                    int64_t* offset) {
  if (rows.offsets == nullptr) {
    *offset = 0;
    return true;
  }
  *offset = rows.offsets[rows.offset_per_row ? r : 0];
  return *offset >= 0 && *offset <= rows.offset_limit;
}

// dst[row][i] = src[row][i] over the strided pair, in units of unit_bytes.
struct StridedCopyArgs {
  void* dst = nullptr;
  const void* src = nullptr;
  int unit_bytes = 1;
  StridedPair pair;  // canonical, in units
  RowSpec rows;
};

// Packed int4: two 4-bit values per byte, element 2j in the low nibble of
// byte j. The innermost axis is addressed in nibbles so that a window may
// start or end inside a byte; each destination byte is read, patched and
// written by exactly one thread, so neighbours outside the window survive.
struct NibbleCopyArgs {
  uint8_t* dst = nullptr;
  const uint8_t* src = nullptr;
  StridedPair outer;  // every axis but the innermost, strides in bytes
  int64_t dst_nibble_start = 0;
  int64_t nibble_count = 0;  // even: the source holds whole bytes
  int64_t dst_inner_stride = 1;  // bytes between consecutive packed bytes
  int64_t src_inner_stride = 1;
  RowSpec rows;  // strides in bytes
  // When true a row's run-time offset moves dst_nibble_start (the offset axis
  // is the packed one); otherwise it moves the base by offset_dst_stride bytes.
  bool offset_in_nibbles = false;
};

// One device-to-device copy of `bytes` on `stream` (cudaStream_t).
KernelStatus copy_bytes_cuda(void* dst, const void* src, int64_t bytes, void* stream);
KernelStatus strided_copy_cuda(const StridedCopyArgs& args, void* stream);
KernelStatus nibble_copy_cuda(const NibbleCopyArgs& args, void* stream);

// The same contracts on the host (rows with an out-of-range offset are skipped
// here too; the CPU op raises before it gets that far).
KernelStatus strided_copy_cpu(const StridedCopyArgs& args);
KernelStatus nibble_copy_cpu(const NibbleCopyArgs& args);

}  // namespace baracuda
