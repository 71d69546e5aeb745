// Op layer of the write_slice family: validate once (every backend shares
// it), choose the path once, then hand a canonical problem to a launcher.
//
//   write_slice_(dest, source, ranges, packed_int4)      in place
//   write_slice(dest, source, ranges, packed_int4)       out of place
//   write_slice_at_(dest, source, dim, offsets, packed)  offset from a tensor
//   write_slice_path(dest, source, ranges, packed_int4)  which path a call takes
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstring>
#include <string>

#include "common/strided_layout.h"
#include "common/torch_glue.h"
#include "write_slice/write_slice_kernels.h"

namespace baracuda {
namespace {

enum class Path { kEmpty, kWholeDest, kContiguousChunk, kStrided, kNibble };

struct Plan {
  Path path = Path::kEmpty;
  // kWholeDest / kContiguousChunk: one copy of `bytes` from src to dst.
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t bytes = 0;
  StridedCopyArgs strided;  // kStrided
  NibbleCopyArgs nibble;    // kNibble
};

std::string describe(const Plan& plan) {
  switch (plan.path) {
    case Path::kEmpty: return "empty";
    case Path::kWholeDest: return "whole_dest";
    case Path::kContiguousChunk: return "contiguous_chunk";
    case Path::kStrided: return "strided:" + std::to_string(plan.strided.unit_bytes);
    case Path::kNibble: return "nibble";
  }
  return "unknown";
}

// Extent of axis d as the caller counts it: packed int4 counts nibbles on the
// innermost axis, which stores two per byte.
int64_t logical_size(const at::Tensor& t, int64_t d, bool packed) {
  const bool nibble_axis = packed && d == t.dim() - 1;
  return nibble_axis ? 2 * t.size(d) : t.size(d);
}

// `writes_dest` is false for the out-of-place op, whose dest is only read
// (its result is a fresh clone, so dest may be expanded or alias source).
void check_common(const char* op, const at::Tensor& dest, const at::Tensor& source,
                  bool packed, bool writes_dest) {
  TORCH_CHECK(dest.layout() == at::kStrided && source.layout() == at::kStrided,
              "baracuda::", op, ": dest and source must be strided tensors, got ",
              dest.layout(), " and ", source.layout());
  TORCH_CHECK(dest.dim() <= kMaxRank, "baracuda::", op, ": dest.dim()=", dest.dim(),
              " exceeds the supported maximum of ", kMaxRank);
  TORCH_CHECK(source.dim() == dest.dim(), "baracuda::", op, ": source.dim()=", source.dim(),
              " must equal dest.dim()=", dest.dim());
  TORCH_CHECK(source.scalar_type() == dest.scalar_type(), "baracuda::", op,
              ": source.dtype=", source.scalar_type(), " must equal dest.dtype=",
              dest.scalar_type());
  TORCH_CHECK(source.device() == dest.device(), "baracuda::", op, ": source.device=",
              source.device(), " must equal dest.device=", dest.device());
  if (packed) {
    TORCH_CHECK(dest.scalar_type() == at::kByte, "baracuda::", op,
                ": packed_int4=True needs uint8 tensors holding two 4-bit values per "
                "byte, got dtype ",
                dest.scalar_type());
    TORCH_CHECK(dest.dim() >= 1, "baracuda::", op,
                ": packed_int4=True needs at least one axis to pack along");
  }
  TORCH_CHECK(!writes_dest || at::has_internal_overlap(dest) != at::MemOverlap::Yes,
              "baracuda::", op,
              ": dest has internal overlap (several elements share one memory "
              "location, e.g. an expanded tensor); writing into it is ambiguous");
}

void check_no_overlap(const char* op, const at::Tensor& dest, const StorageSpan& window,
                      const at::Tensor& source) {
  if (source.numel() == 0) return;
  const StorageSpan source_span =
      storage_span(source.storage_offset(), source.sizes(), source.strides());
  TORCH_CHECK(!spans_intersect(dest, window, source, source_span), "baracuda::", op,
              ": source memory overlaps the written part of dest; copy the source "
              "first (source.clone())");
}

// Window of dest written by write_slice_, in storage elements: starts and
// extents per axis (bytes on a packed innermost axis, rounded outwards).
struct StorageWindow {
  int64_t starts[kMaxRank] = {};
  int64_t sizes[kMaxRank] = {};
};

StorageWindow validate_ranges(const char* op, const at::Tensor& dest,
                              const at::Tensor& source, at::IntArrayRef ranges, bool packed,
                              bool writes_dest) {
  check_common(op, dest, source, packed, writes_dest);
  const int64_t rank = dest.dim();
  // ranges arrives flat; the caller wrote pairs, so count pairs.
  TORCH_CHECK(ranges.size() % 2 == 0, "baracuda::", op, ": ranges=", ranges,
              " has an odd length; it must hold one (start, end) pair per axis of dest, "
              "flattened");
  TORCH_CHECK(static_cast<int64_t>(ranges.size()) == 2 * rank, "baracuda::", op, ": got ",
              ranges.size() / 2, " ranges for a ", rank,
              "-d dest; expected one (start, end) pair per axis");
  StorageWindow w;
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t start = ranges[2 * d], end = ranges[2 * d + 1];
    const int64_t size = logical_size(dest, d, packed);
    TORCH_CHECK(0 <= start && start <= end && end <= size, "baracuda::", op, ": ranges[", d,
                "]=(", start, ", ", end, ") must satisfy 0 <= start <= end <= ", size);
    const bool nibble_axis = packed && d == rank - 1;
    if (nibble_axis) {
      TORCH_CHECK((end - start) % 2 == 0, "baracuda::", op, ": ranges[", d, "]=(", start,
                  ", ", end, ") spans ", end - start,
                  " packed int4 values; an odd count cannot be held in whole source "
                  "bytes");
      TORCH_CHECK(2 * source.size(d) == end - start, "baracuda::", op, ": source.shape[",
                  d, "]=", source.size(d), " bytes holds ", 2 * source.size(d),
                  " packed int4 values, but ranges[", d, "]=(", start, ", ", end,
                  ") spans ", end - start);
      w.starts[d] = start / 2;
      w.sizes[d] = end > start ? (end - 1) / 2 - start / 2 + 1 : 0;
    } else {
      TORCH_CHECK(source.size(d) == end - start, "baracuda::", op, ": source.shape[", d,
                  "]=", source.size(d), " must equal end - start = ", end - start,
                  " for ranges[", d, "]=(", start, ", ", end, ")");
      w.starts[d] = start;
      w.sizes[d] = end - start;
    }
  }
  bool empty = false;
  int64_t offset = dest.storage_offset();
  for (int64_t d = 0; d < rank; ++d) {
    empty = empty || w.sizes[d] == 0;
    offset += w.starts[d] * dest.stride(d);
  }
  if (writes_dest && !empty) {
    check_no_overlap(op, dest, storage_span(offset, at::IntArrayRef(w.sizes, rank),
                                            dest.strides()),
                     source);
  }
  return w;
}

// Element-wise (or byte-wise) copy of the pair; a single dense run becomes
// one device copy, anything else the strided kernel in the widest unit.
Plan plan_elementwise(StridedPair pair, char* dst, const char* src, int elem_bytes,
                      bool covers_all_of_dest) {
  Plan plan;
  canonicalize(pair);
  if (pair.numel() == 0) return plan;
  if (pair.is_single_dense_run()) {
    plan.path = covers_all_of_dest ? Path::kWholeDest : Path::kContiguousChunk;
    plan.dst = dst;
    plan.src = src;
    plan.bytes = pair.sizes[0] * elem_bytes;
    return plan;
  }
  const int unit = widest_unit_bytes(pair, elem_bytes, reinterpret_cast<uintptr_t>(dst),
                                     reinterpret_cast<uintptr_t>(src), nullptr, 0);
  rescale_to_unit(pair, elem_bytes, unit);
  plan.path = Path::kStrided;
  plan.strided.dst = dst;
  plan.strided.src = src;
  plan.strided.unit_bytes = unit;
  plan.strided.pair = pair;
  return plan;
}

// The plan for writing `source` into window `w` of `dest` (validated already).
Plan plan_write_slice(const at::Tensor& dest, const at::Tensor& source, at::IntArrayRef ranges,
                      bool packed, const StorageWindow& w) {
  const int64_t rank = dest.dim();
  char* dst = static_cast<char*>(dest.data_ptr());
  const char* src = static_cast<const char*>(source.const_data_ptr());
  const int elem = static_cast<int>(dest.element_size());
  for (int64_t d = 0; d < rank; ++d) dst += w.starts[d] * dest.stride(d) * elem;

  bool covers_all = true;
  for (int64_t d = 0; d < rank; ++d) covers_all = covers_all && w.sizes[d] == dest.size(d);

  const int64_t inner = rank - 1;
  const bool byte_aligned =
      !packed || (ranges[2 * inner] % 2 == 0 && ranges[2 * inner + 1] % 2 == 0);
  if (byte_aligned) {
    // Packed windows on byte boundaries are plain byte copies.
    StridedPair pair;
    pair.rank = static_cast<int>(rank);
    for (int64_t d = 0; d < rank; ++d) {
      pair.sizes[d] = w.sizes[d];
      pair.dst_strides[d] = dest.stride(d);
      pair.src_strides[d] = source.stride(d);
    }
    return plan_elementwise(pair, dst, src, elem, covers_all);
  }

  // Packed int4 with a window edge inside a byte: patch bytes nibble by nibble.
  Plan plan;
  NibbleCopyArgs& n = plan.nibble;
  n.outer.rank = static_cast<int>(inner);
  for (int64_t d = 0; d < inner; ++d) {
    n.outer.sizes[d] = w.sizes[d];
    n.outer.dst_strides[d] = dest.stride(d);
    n.outer.src_strides[d] = source.stride(d);
  }
  canonicalize(n.outer);
  // The nibble kernel addresses the innermost axis itself, from the row start.
  n.dst = reinterpret_cast<uint8_t*>(dst) - w.starts[inner] * dest.stride(inner);
  n.src = reinterpret_cast<const uint8_t*>(src);
  n.dst_nibble_start = ranges[2 * inner];
  n.nibble_count = ranges[2 * inner + 1] - ranges[2 * inner];
  n.dst_inner_stride = dest.stride(inner);
  n.src_inner_stride = source.stride(inner);
  plan.path = (n.nibble_count == 0 || n.outer.numel() == 0) ? Path::kEmpty : Path::kNibble;
  return plan;
}

void run_plan(const char* op, const Plan& plan, const at::Tensor& dest) {
  if (plan.path == Path::kEmpty) return;
  if (dest.is_cpu()) {
    switch (plan.path) {
      case Path::kWholeDest:
      case Path::kContiguousChunk:
        std::memcpy(plan.dst, plan.src, plan.bytes);
        return;
      case Path::kStrided:
        return check_status(strided_copy_cpu(plan.strided), op, "strided copy");
      case Path::kNibble:
        return check_status(nibble_copy_cpu(plan.nibble), op, "packed int4 copy");
      case Path::kEmpty:
        return;
    }
  }
#ifdef BARACUDA_WITH_CUDA
  TORCH_CHECK(dest.is_cuda(), "baracuda::", op, ": unsupported device ", dest.device());
  const c10::DeviceGuard guard(dest.device());
  void* stream = current_cuda_stream(dest);
  switch (plan.path) {
    case Path::kWholeDest:
    case Path::kContiguousChunk:
      return check_status(copy_bytes_cuda(plan.dst, plan.src, plan.bytes, stream), op,
                          "device copy");
    case Path::kStrided:
      return check_status(strided_copy_cuda(plan.strided, stream), op, "strided copy");
    case Path::kNibble:
      return check_status(nibble_copy_cuda(plan.nibble, stream), op, "packed int4 copy");
    case Path::kEmpty:
      return;
  }
#else
  TORCH_CHECK(false, "baracuda::", op, ": built without CUDA kernels; got ", dest.device());
#endif
}

// The schemas take SymInt[] so torch.compile can trace a moving position
// without recompiling; by the time a real kernel runs the values are concrete.
at::IntArrayRef concrete(c10::SymIntArrayRef ranges) { return C10_AS_INTARRAYREF_SLOW(ranges); }

// Conjugate and negative views never reach these functions: the dispatcher's
// math-bit fallbacks materialize them first (and write back into a flagged dest).
void write_slice_(const at::Tensor& dest, const at::Tensor& source,
                  c10::SymIntArrayRef sym_ranges, bool packed_int4) {
  const char* op = "write_slice_";
  const at::IntArrayRef ranges = concrete(sym_ranges);
  const StorageWindow w = validate_ranges(op, dest, source, ranges, packed_int4, true);
  run_plan(op, plan_write_slice(dest, source, ranges, packed_int4, w), dest);
}

at::Tensor write_slice(const at::Tensor& dest, const at::Tensor& source,
                       c10::SymIntArrayRef sym_ranges, bool packed_int4) {
  const at::IntArrayRef ranges = concrete(sym_ranges);
  // Validate once, before allocating the result, so a bad call costs nothing.
  // The result has dest's shape, so the window (in elements) is the same;
  // being a fresh tensor, it needs none of the in-place overlap checks.
  const StorageWindow w = validate_ranges("write_slice", dest, source, ranges, packed_int4, false);
  at::Tensor out = dest.clone();
  run_plan("write_slice", plan_write_slice(out, source, ranges, packed_int4, w), out);
  return out;
}

std::string write_slice_path(const at::Tensor& dest, const at::Tensor& source,
                             c10::SymIntArrayRef ranges, bool packed_int4) {
  const at::IntArrayRef r = concrete(ranges);
  const StorageWindow w = validate_ranges("write_slice_path", dest, source, r, packed_int4, true);
  return describe(plan_write_slice(dest, source, r, packed_int4, w));
}

// ---------------------------------------------------------------- write_slice_at_

struct AtRequest {
  int64_t dim;
  int64_t length;  // logical extent of source along dim
  bool per_row;
};

AtRequest validate_at(const char* op, const at::Tensor& dest, const at::Tensor& source,
                      int64_t dim_in, const at::Tensor& offsets, bool packed) {
  check_common(op, dest, source, packed, true);
  const int64_t rank = dest.dim();
  TORCH_CHECK(rank >= 1, "baracuda::", op, ": dest must have at least one axis");
  TORCH_CHECK(-rank <= dim_in && dim_in < rank, "baracuda::", op, ": dim=", dim_in,
              " is out of range for a ", rank, "-d dest");
  const int64_t dim = dim_in < 0 ? dim_in + rank : dim_in;
  TORCH_CHECK(offsets.scalar_type() == at::kLong, "baracuda::", op,
              ": offsets must be int64, got ", offsets.scalar_type());
  TORCH_CHECK(offsets.device() == dest.device(), "baracuda::", op, ": offsets.device=",
              offsets.device(), " must equal dest.device=", dest.device());
  const bool per_row = offsets.dim() == 1;
  TORCH_CHECK(offsets.dim() == 0 || per_row, "baracuda::", op,
              ": offsets must have shape [] or [dest.shape[0]], got ", offsets.sizes());
  if (per_row) {
    TORCH_CHECK(dim > 0, "baracuda::", op,
                ": per-row offsets (shape [dest.shape[0]]) need dim > 0, got dim=", dim_in);
    TORCH_CHECK(offsets.size(0) == dest.size(0), "baracuda::", op, ": offsets.shape=",
                offsets.sizes(), " must be [dest.shape[0]] = [", dest.size(0), "]");
  }
  for (int64_t d = 0; d < rank; ++d) {
    if (d == dim) continue;
    TORCH_CHECK(source.size(d) == dest.size(d), "baracuda::", op, ": source.shape[", d,
                "]=", source.size(d), " must equal dest.shape[", d, "]=", dest.size(d),
                " (only dim=", dim, " may differ)");
  }
  const int64_t length = logical_size(source, dim, packed);
  TORCH_CHECK(length <= logical_size(dest, dim, packed), "baracuda::", op,
              ": source length ", length, " along dim=", dim, " exceeds dest's ",
              logical_size(dest, dim, packed));
  const StorageSpan whole = storage_span(dest.storage_offset(), dest.sizes(), dest.strides());
  if (dest.numel() > 0) check_no_overlap(op, dest, whole, source);
  return {dim, length, per_row};
}

// The CPU path can see the offsets, so it refuses out-of-range ones outright
// (the CUDA path cannot without a host sync; there such a row writes nothing).
void check_offsets_on_host(const char* op, const at::Tensor& dest, const at::Tensor& offsets,
                           const AtRequest& req, bool packed) {
  const at::Tensor flat = offsets.reshape({-1});
  const int64_t* values = flat.const_data_ptr<int64_t>();
  const int64_t limit = logical_size(dest, req.dim, packed) - req.length;
  for (int64_t i = 0; i < flat.numel(); ++i) {
    TORCH_CHECK(0 <= values[i] && values[i] <= limit, "baracuda::", op, ": offsets[", i,
                "]=", values[i], " puts the source (length ", req.length, " along dim=",
                req.dim, ") outside dest.shape[", req.dim, "]=",
                logical_size(dest, req.dim, packed), "; valid offsets are 0..", limit);
  }
}

Plan plan_write_slice_at(const at::Tensor& dest, const at::Tensor& source,
                         const at::Tensor& offsets_in, const AtRequest& req, bool packed) {
  Plan plan;
  const int64_t rank = dest.dim();
  if (source.numel() == 0) return plan;
  const at::Tensor offsets = offsets_in.expect_contiguous()->view({-1});
  RowSpec rows;
  rows.offsets = offsets.const_data_ptr<int64_t>();
  rows.offset_per_row = req.per_row;
  rows.offset_dst_stride = dest.stride(req.dim);
  rows.offset_limit = logical_size(dest, req.dim, packed) - req.length;
  const int64_t first_axis = req.per_row ? 1 : 0;
  if (req.per_row) {
    rows.count = dest.size(0);
    rows.dst_stride = dest.stride(0);
    rows.src_stride = source.stride(0);
  }
  char* dst = static_cast<char*>(dest.data_ptr());
  const char* src = static_cast<const char*>(source.const_data_ptr());
  const int64_t inner = rank - 1;

  if (packed && req.dim == inner) {
    plan.path = Path::kNibble;
    NibbleCopyArgs& n = plan.nibble;
    for (int64_t d = first_axis; d < inner; ++d) {
      n.outer.sizes[n.outer.rank] = source.size(d);
      n.outer.dst_strides[n.outer.rank] = dest.stride(d);
      n.outer.src_strides[n.outer.rank] = source.stride(d);
      ++n.outer.rank;
    }
    canonicalize(n.outer);
    n.dst = reinterpret_cast<uint8_t*>(dst);
    n.src = reinterpret_cast<const uint8_t*>(src);
    n.nibble_count = req.length;
    n.dst_inner_stride = dest.stride(inner);
    n.src_inner_stride = source.stride(inner);
    n.rows = rows;
    n.offset_in_nibbles = true;
    return plan;
  }

  StridedPair pair;
  for (int64_t d = first_axis; d < rank; ++d) {
    pair.sizes[pair.rank] = source.size(d);
    pair.dst_strides[pair.rank] = dest.stride(d);
    pair.src_strides[pair.rank] = source.stride(d);
    ++pair.rank;
  }
  canonicalize(pair);
  const int elem = static_cast<int>(dest.element_size());
  const int64_t extra[3] = {rows.dst_stride, rows.src_stride, rows.offset_dst_stride};
  const int unit = widest_unit_bytes(pair, elem, reinterpret_cast<uintptr_t>(dst),
                                     reinterpret_cast<uintptr_t>(src), extra, 3);
  rescale_to_unit(pair, elem, unit);
  const int64_t ratio = unit / elem;
  rows.dst_stride /= ratio;
  rows.src_stride /= ratio;
  rows.offset_dst_stride /= ratio;
  plan.path = Path::kStrided;
  plan.strided.dst = dst;
  plan.strided.src = src;
  plan.strided.unit_bytes = unit;
  plan.strided.pair = pair;
  plan.strided.rows = rows;
  return plan;
}

void write_slice_at_(const at::Tensor& dest, const at::Tensor& source, int64_t dim,
                     const at::Tensor& offsets, bool packed_int4) {
  const char* op = "write_slice_at_";
  const AtRequest req = validate_at(op, dest, source, dim, offsets, packed_int4);
  if (dest.is_cpu()) check_offsets_on_host(op, dest, offsets, req, packed_int4);
  run_plan(op, plan_write_slice_at(dest, source, offsets, req, packed_int4), dest);
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("write_slice_", &write_slice_);
  m.impl("write_slice", &write_slice);
  m.impl("write_slice_at_", &write_slice_at_);
}

#ifdef BARACUDA_WITH_CUDA
TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("write_slice_", &write_slice_);
  m.impl("write_slice", &write_slice);
  m.impl("write_slice_at_", &write_slice_at_);
}
#endif

// Reads only metadata and pointers, so it is the same on every device.
TORCH_LIBRARY_IMPL(baracuda, CompositeExplicitAutograd, m) {
  m.impl("write_slice_path", &write_slice_path);
}

}  // namespace baracuda
