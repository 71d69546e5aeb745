// Launchers of the integer scans: cumsum / cumprod of integer and bool data
// (in wrapping int64 arithmetic, stored in any integer type) and cummax /
// cummin of integer and bool data (values in their own type, int64
// indices). Integer scans are exact, so one small engine per backend serves
// every shape; the float engine (scan_kernels.h) is not instantiated for
// them. Tensors are contiguous and viewed as [outer, len, inner] around the
// scan axis, as in scan_kernels.h. No torch headers.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "scan/scan_kernels.h"

namespace baracuda {

// The element types an integer scan reads or writes.
enum class IntegerDtype : int {
  kBool, kUInt8, kInt8, kInt16, kUInt16, kInt32, kUInt32, kInt64, kUInt64
};

// y = scan(x) along the axis, reverse from the last element to the first.
// kind is kCumsum, kCumprod, kCummax or kCummin. cumsum / cumprod read x of
// x_dtype and write y of y_dtype: the low bits of the int64 scan of x, which
// are those of the scan in y_dtype of x cast to y_dtype (integer addition
// and multiplication wrap the same way at every width). cummax / cummin
// keep x's dtype (y_dtype == x_dtype) and write int64 indices, a later
// element (in scan order) winning ties, as in torch.
struct IntegerScanArgs {
  ScanKind kind = ScanKind::kCumsum;
  IntegerDtype x_dtype = IntegerDtype::kInt64;
  IntegerDtype y_dtype = IntegerDtype::kInt64;
  ScanShape shape;
  bool reverse = false;
  const void* x = nullptr;
  void* y = nullptr;
  int64_t* indices = nullptr;  // cummax / cummin only
};

// Lines [first, last) of the shape's outer * inner lines, each from its
// start (scan_forward_cpu_lines' contract), so lines may go to threads.
KernelStatus scan_integer_cpu_lines(const IntegerScanArgs& args, int64_t first, int64_t last);
// On `stream` (a cudaStream_t).
KernelStatus scan_integer_cuda(const IntegerScanArgs& args, void* stream);

}  // namespace baracuda
