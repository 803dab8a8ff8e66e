// The prefill plan's byte image: the layout of its arrays in the workspace and the serializer that
// writes a PrefillSchedule there (plan() then copies the image to the device asynchronously).
// Same shape as the decode plan's (decode_plan_serialize.cpp).
#include <climits>
#include <cstring>
#include <type_traits>

#include "flashkv/error.h"
#include "scheduler/prefill_scheduler.h"

namespace flashkv::scheduler {
namespace {

// The kernels read these structs straight out of the bytes written here, compiled by NVRTC from
// the same header: both sides must see plain 4-byte ints with no padding.
template <class T>
constexpr bool kPackedInts = std::is_trivially_copyable_v<T> && alignof(T) == alignof(int) &&
                             sizeof(T) % sizeof(int) == 0;
static_assert(kPackedInts<PrefillWorkItem>, "PrefillWorkItem must stay packed ints (raw bytes)");
static_assert(kPackedInts<PrefillMergeItem>, "PrefillMergeItem must stay packed ints (raw bytes)");
static_assert(sizeof(PrefillPlanHeader) == 4 * sizeof(int), "PrefillPlanHeader is 4 ints");

// 16 bytes: every array can then be read with 16-byte vector loads (and cp.async) on the device.
constexpr size_t kPlanAlignment = 16;

constexpr size_t align_up(size_t x) {
  return (x + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment;
}

}  // namespace

PrefillPlanLayout prefill_plan_layout(int num_ctas, int max_work_items, int max_merge_items) {
  check(num_ctas > 0, "prefill_plan_layout: num_ctas must be > 0 (got ", num_ctas, ")");
  check(max_work_items > 0, "prefill_plan_layout: max_work_items must be > 0 (got ", max_work_items,
        ")");
  check(max_merge_items >= 0, "prefill_plan_layout: max_merge_items must be >= 0 (got ",
        max_merge_items, ")");
  PrefillPlanLayout l;
  l.num_ctas = num_ctas;
  l.max_work_items = max_work_items;
  l.max_merge_items = max_merge_items;
  l.header = 0;
  l.cta_work_indptr = align_up(sizeof(PrefillPlanHeader));
  l.work = align_up(l.cta_work_indptr + (static_cast<size_t>(num_ctas) + 1) * sizeof(int));
  l.bytes = align_up(l.work + static_cast<size_t>(max_work_items) * sizeof(PrefillWorkItem)) +
            align_up(static_cast<size_t>(max_merge_items) * sizeof(PrefillMergeItem));
  // The header's merge_offset is an int.
  check(l.bytes <= static_cast<size_t>(INT_MAX), "prefill_plan_layout: a plan region of ", l.bytes,
        " bytes (", max_work_items, " work items, ", max_merge_items,
        " merge items) exceeds the int offsets of PrefillPlanHeader");
  return l;
}

size_t serialize_prefill_schedule(const PrefillSchedule& s, const PrefillPlanLayout& layout,
                                  std::byte* dst) {
  check(dst != nullptr, "serialize_prefill_schedule: dst is null");
  check(s.num_ctas == layout.num_ctas, "serialize_prefill_schedule: the schedule has ", s.num_ctas,
        " CTAs but the layout was made for ", layout.num_ctas);
  check(s.cta_work_indptr.size() == static_cast<size_t>(s.num_ctas) + 1,
        "serialize_prefill_schedule: cta_work_indptr has ", s.cta_work_indptr.size(),
        " entries, expected num_ctas + 1 = ", s.num_ctas + 1);
  check(s.work.size() <= static_cast<size_t>(layout.max_work_items),
        "serialize_prefill_schedule: ", s.work.size(), " work items exceed the layout's ",
        layout.max_work_items);
  check(s.merge.size() <= static_cast<size_t>(layout.max_merge_items),
        "serialize_prefill_schedule: ", s.merge.size(), " merge items exceed the layout's ",
        layout.max_merge_items);
  const size_t merge_offset = align_up(layout.work + s.work.size() * sizeof(PrefillWorkItem));
  PrefillPlanHeader h{};
  h.num_merge_items = static_cast<int>(s.merge.size());
  h.merge_offset = static_cast<int>(merge_offset);
  h.num_work_items = static_cast<int>(s.work.size());
  h.tile_rows = s.tile_rows;
  std::memcpy(dst + layout.header, &h, sizeof(h));
  std::memcpy(dst + layout.cta_work_indptr, s.cta_work_indptr.data(),
              s.cta_work_indptr.size() * sizeof(int));
  if (!s.work.empty()) {
    std::memcpy(dst + layout.work, s.work.data(), s.work.size() * sizeof(PrefillWorkItem));
  }
  if (!s.merge.empty()) {
    std::memcpy(dst + merge_offset, s.merge.data(), s.merge.size() * sizeof(PrefillMergeItem));
  }
  return merge_offset + s.merge.size() * sizeof(PrefillMergeItem);
}

}  // namespace flashkv::scheduler
