// The byte image of a plan (decode and prefill alike), as the kernels read it from the workspace:
//   [Header][cta_work_indptr: num_ctas + 1 ints][used work items][used merge items]
// (decode's block mode uses only the first num_ctas / ctas_per_unit + 1 indptr entries: one per
// unit of CTAs, decode_plan.cuh)
// each piece 16-byte aligned; Header holds num_merge_items, merge_offset (bytes from the start,
// where the merge items follow the used work items) and num_work_items, plus one field of the
// op's own. Only the bytes used are copied to the device at each plan().
#pragma once

#include <climits>
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>

#include "flashkv/error.h"

namespace flashkv::scheduler {

struct PlanLayout {
  size_t header = 0;           // offsets in bytes from the start of the region
  size_t cta_work_indptr = 0;  // [num_ctas + 1] ints (decode: its unit_work_indptr)
  size_t work = 0;             // used work items, then (16-byte aligned) the used merge items
  size_t bytes = 0;            // capacity of the region for the largest schedule
  int num_ctas = 0;            // the capacities the layout was made for
  int max_work_items = 0;
  int max_merge_items = 0;
};

namespace detail {
// The kernels read the structs straight out of these bytes, compiled by NVRTC from the same
// header: both sides must see plain 4-byte ints with no padding.
template <class T>
constexpr bool kPackedInts = std::is_trivially_copyable_v<T> && alignof(T) == alignof(int) &&
                             sizeof(T) % sizeof(int) == 0;
// 16 bytes: every array can then be read with 16-byte vector loads on the device.
constexpr size_t align16(size_t x) { return (x + 15) / 16 * 16; }
}  // namespace detail

template <class Header, class Work, class Merge>
PlanLayout plan_image_layout(const char* what, int num_ctas, int max_work_items,
                             int max_merge_items) {
  static_assert(
      detail::kPackedInts<Header> && detail::kPackedInts<Work> && detail::kPackedInts<Merge>,
      "plan structs must stay packed ints (raw bytes)");
  check(num_ctas > 0, what, ": num_ctas must be > 0 (got ", num_ctas, ")");
  check(max_work_items > 0, what, ": max_work_items must be > 0 (got ", max_work_items, ")");
  check(max_merge_items >= 0, what, ": max_merge_items must be >= 0 (got ", max_merge_items, ")");
  PlanLayout l;
  l.num_ctas = num_ctas;
  l.max_work_items = max_work_items;
  l.max_merge_items = max_merge_items;
  l.cta_work_indptr = detail::align16(sizeof(Header));
  l.work = detail::align16(l.cta_work_indptr + (static_cast<size_t>(num_ctas) + 1) * sizeof(int));
  l.bytes = detail::align16(l.work + static_cast<size_t>(max_work_items) * sizeof(Work)) +
            detail::align16(static_cast<size_t>(max_merge_items) * sizeof(Merge));
  check(l.bytes <= static_cast<size_t>(INT_MAX), what, ": a plan region of ", l.bytes, " bytes (",
        max_work_items, " work items, ", max_merge_items,
        " merge items) exceeds the int offsets of the plan header");
  return l;
}

// Writes the image into dst (layout.bytes long) and returns the bytes used. `h` carries the op's
// own header field; the counts and merge_offset are filled here. The CTAs run in units of
// ctas_per_unit (decode's block mode, decode_plan.cuh): the indptr has num_ctas / ctas_per_unit
// + 1 entries, the first ones of the region's layout.num_ctas + 1 (the rest is not read).
template <class Header, class Work, class Merge>
size_t write_plan_image(const char* what, const PlanLayout& layout, int num_ctas, int ctas_per_unit,
                        std::span<const int> unit_work_indptr, std::span<const Work> work,
                        std::span<const Merge> merge, Header h, std::byte* dst) {
  check(dst != nullptr, what, ": dst is null");
  // A schedule may use fewer CTAs than the layout holds (decode's auto shape picks 1, 2 or 4 per
  // SM in a workspace made for 4: its grid is the schedule's; prefill checks equality itself).
  check(num_ctas >= 1 && num_ctas <= layout.num_ctas, what, ": the schedule has ", num_ctas,
        " CTAs; the layout holds 1 to ", layout.num_ctas);
  check(ctas_per_unit >= 1 && num_ctas % ctas_per_unit == 0, what, ": ", ctas_per_unit,
        " CTAs per unit do not divide the ", num_ctas, " CTAs");
  const int units = num_ctas / ctas_per_unit;
  check(unit_work_indptr.size() == static_cast<size_t>(units) + 1, what, ": the work indptr has ",
        unit_work_indptr.size(), " entries, expected num_ctas / ctas_per_unit + 1 = ", units + 1);
  check(work.size() <= static_cast<size_t>(layout.max_work_items), what, ": ", work.size(),
        " work items exceed the layout's ", layout.max_work_items);
  check(merge.size() <= static_cast<size_t>(layout.max_merge_items), what, ": ", merge.size(),
        " merge items exceed the layout's ", layout.max_merge_items);
  const size_t merge_offset = detail::align16(layout.work + work.size() * sizeof(Work));
  h.num_merge_items = static_cast<int>(merge.size());
  h.merge_offset = static_cast<int>(merge_offset);
  h.num_work_items = static_cast<int>(work.size());
  std::memcpy(dst + layout.header, &h, sizeof(h));
  std::memcpy(dst + layout.cta_work_indptr, unit_work_indptr.data(), unit_work_indptr.size_bytes());
  // (Items the scheduler wrote into the image itself are in place: no copy onto themselves.)
  const void* in_place = dst + layout.work;
  if (!work.empty() && work.data() != in_place) {
    std::memcpy(dst + layout.work, work.data(), work.size_bytes());
  }
  if (!merge.empty()) std::memcpy(dst + merge_offset, merge.data(), merge.size_bytes());
  return merge_offset + merge.size_bytes();
}

// One unit per CTA (prefill): cta_work_indptr has num_ctas + 1 entries.
template <class Header, class Work, class Merge>
size_t write_plan_image(const char* what, const PlanLayout& layout, int num_ctas,
                        std::span<const int> cta_work_indptr, std::span<const Work> work,
                        std::span<const Merge> merge, Header h, std::byte* dst) {
  return write_plan_image<Header, Work, Merge>(what, layout, num_ctas, 1, cta_work_indptr, work,
                                               merge, h, dst);
}

}  // namespace flashkv::scheduler
