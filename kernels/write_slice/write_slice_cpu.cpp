// Host executors of the write_slice launch contracts (write_slice_kernels.h).
#include <cstring>

#include "common/unit_types.h"
#include "write_slice/nibble_patch.h"
#include "write_slice/write_slice_kernels.h"

namespace baracuda {
namespace {

// Visits every element offset pair of the axes [0, rank - 1) of `pair`
// (all axes but the innermost) in row-major order, by odometer.
template <typename Fn>
void for_each_outer(const StridedPair& pair, Fn&& fn) {
  const int outer_rank = pair.rank > 0 ? pair.rank - 1 : 0;
  int64_t outer = 1;
  for (int d = 0; d < outer_rank; ++d) outer *= pair.sizes[d];
  int64_t idx[kMaxRank] = {};
  int64_t dst_off = 0, src_off = 0;
  for (int64_t o = 0; o < outer; ++o) {
    fn(dst_off, src_off);
    for (int d = outer_rank - 1; d >= 0; --d) {
      if (++idx[d] < pair.sizes[d]) {
        dst_off += pair.dst_strides[d];
        src_off += pair.src_strides[d];
        break;
      }
      dst_off -= (pair.sizes[d] - 1) * pair.dst_strides[d];
      src_off -= (pair.sizes[d] - 1) * pair.src_strides[d];
      idx[d] = 0;
    }
  }
}

template <int W>
void strided_copy_rows(const StridedCopyArgs& a) {
  using U = unit_t<W>;
  const StridedPair& p = a.pair;
  const int inner = p.rank - 1;
  const int64_t n = p.sizes[inner];
  const int64_t ds = p.dst_strides[inner], ss = p.src_strides[inner];
  for (int64_t r = 0; r < a.rows.count; ++r) {
    int64_t offset;
    if (!resolve_row_offset(a.rows, r, &offset)) continue;
    U* dst = static_cast<U*>(a.dst) + r * a.rows.dst_stride + offset * a.rows.offset_dst_stride;
    const U* src = static_cast<const U*>(a.src) + r * a.rows.src_stride;
    for_each_outer(p, [&](int64_t dst_off, int64_t src_off) {
      U* d = dst + dst_off;
      const U* s = src + src_off;
      if (ds == 1 && ss == 1) {
        std::memcpy(d, s, n * sizeof(U));
      } else {
        for (int64_t k = 0; k < n; ++k) d[k * ds] = s[k * ss];
      }
    });
  }
}

}  // namespace

KernelStatus strided_copy_cpu(const StridedCopyArgs& args) {
  if (args.pair.rank < 1 || args.pair.rank > kMaxRank) {
    return KernelStatus::invalid("strided copy rank must be in [1, 8]");
  }
  if (args.pair.numel() == 0 || args.rows.count == 0) return KernelStatus::ok();
  return dispatch_unit_width(args.unit_bytes, [&](auto width) {
    strided_copy_rows<decltype(width)::value>(args);
    return KernelStatus::ok();
  });
}

KernelStatus nibble_copy_cpu(const NibbleCopyArgs& a) {
  if (a.outer.rank < 0 || a.outer.rank > kMaxRank - 1) {
    return KernelStatus::invalid("packed int4 copy needs at most 7 outer axes");
  }
  if (a.nibble_count == 0 || a.outer.numel() == 0) return KernelStatus::ok();
  // for_each_outer walks all axes but the last; give it one extra dummy axis.
  StridedPair walk = a.outer;
  walk.sizes[walk.rank] = 1;
  walk.dst_strides[walk.rank] = 0;
  walk.src_strides[walk.rank] = 0;
  ++walk.rank;
  for (int64_t r = 0; r < a.rows.count; ++r) {
    int64_t offset;
    if (!resolve_row_offset(a.rows, r, &offset)) continue;
    uint8_t* dst = a.dst + r * a.rows.dst_stride;
    int64_t start = a.dst_nibble_start;
    if (a.offset_in_nibbles) {
      start += offset;
    } else {
      dst += offset * a.rows.offset_dst_stride;
    }
    const uint8_t* src = a.src + r * a.rows.src_stride;
    const int64_t first = first_nibble_byte(start);
    const int64_t last = last_nibble_byte(start, a.nibble_count);
    for_each_outer(walk, [&](int64_t dst_off, int64_t src_off) {
      for (int64_t b = first; b <= last; ++b) {
        uint8_t& byte = dst[dst_off + b * a.dst_inner_stride];
        byte = patch_nibble_byte(byte, b, start, a.nibble_count, src + src_off,
                                 a.src_inner_stride);
      }
    });
  }
  return KernelStatus::ok();
}

}  // namespace baracuda
