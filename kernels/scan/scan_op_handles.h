// The scan ops as C++ calls them through the dispatcher (so that autograd
// and every other key see the call): their signatures, a typed handle by
// name, and scan_backward with its optional tensors given as undefined ones.
// Used by the scans' autograd (scan_autograd.cpp, scan_double_backward.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

#include "common/op_handle.h"

namespace baracuda {

using ValueScanFn = at::Tensor(const at::Tensor&, int64_t, bool);
// cumsum, cumprod: a dtype to cast x to and scan in.
using DtypeScanFn = at::Tensor(const at::Tensor&, int64_t, bool, std::optional<at::ScalarType>);
using IndexedScanFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t, bool);
using ScanBackwardFn =
    at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&,
               const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, int64_t,
               c10::string_view, bool);

// baracuda::scan_backward, an absent x, y or indices passed undefined.
at::Tensor scan_backward_op(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& y,
                            const at::Tensor& indices, int64_t dim, c10::string_view kind,
                            bool reverse);

}  // namespace baracuda
