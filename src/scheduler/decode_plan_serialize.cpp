// The decode plan's byte image: the layout of its arrays in the workspace and the serializer that
// writes a DecodeSchedule there (plan() then copies the image to the device asynchronously).
#include <cstring>
#include <type_traits>

#include "flashkv/error.h"
#include "scheduler/decode_scheduler.h"

namespace flashkv::scheduler {
namespace {

// The kernels read these structs straight out of the bytes written here, compiled by NVRTC from
// the same header: both sides must see plain 4-byte ints with no padding.
template <class T>
constexpr bool kPackedInts = std::is_trivially_copyable_v<T> && alignof(T) == alignof(int) &&
                             sizeof(T) % sizeof(int) == 0;
static_assert(kPackedInts<DecodeWorkItem>, "DecodeWorkItem must stay packed ints (raw bytes)");
static_assert(kPackedInts<DecodeMergeItem>, "DecodeMergeItem must stay packed ints (raw bytes)");

// 16 bytes: every array can then be read with 16-byte vector loads (and cp.async) on the device.
constexpr size_t kPlanAlignment = 16;

constexpr size_t align_up(size_t x) {
  return (x + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment;
}

}  // namespace

DecodePlanLayout decode_plan_layout(int num_ctas, int max_work_items, int max_merge_items) {
  check(num_ctas > 0, "decode_plan_layout: num_ctas must be > 0 (got ", num_ctas, ")");
  check(max_work_items > 0, "decode_plan_layout: max_work_items must be > 0 (got ", max_work_items,
        ")");
  check(max_merge_items >= 0, "decode_plan_layout: max_merge_items must be >= 0 (got ",
        max_merge_items, ")");
  DecodePlanLayout l;
  l.num_ctas = num_ctas;
  l.max_work_items = max_work_items;
  l.max_merge_items = max_merge_items;
  l.header = 0;
  l.cta_work_indptr = align_up(sizeof(DecodePlanHeader));
  l.work = align_up(l.cta_work_indptr + (static_cast<size_t>(num_ctas) + 1) * sizeof(int));
  l.bytes = align_up(l.work + static_cast<size_t>(max_work_items) * sizeof(DecodeWorkItem)) +
            align_up(static_cast<size_t>(max_merge_items) * sizeof(DecodeMergeItem));
  return l;
}

size_t serialize_decode_schedule(const DecodeSchedule& s, const DecodePlanLayout& layout,
                                 std::byte* dst) {
  check(dst != nullptr, "serialize_decode_schedule: dst is null");
  check(s.num_ctas == layout.num_ctas, "serialize_decode_schedule: the schedule has ", s.num_ctas,
        " CTAs but the layout was made for ", layout.num_ctas);
  check(s.cta_work_indptr.size() == static_cast<size_t>(s.num_ctas) + 1,
        "serialize_decode_schedule: cta_work_indptr has ", s.cta_work_indptr.size(),
        " entries, expected num_ctas + 1 = ", s.num_ctas + 1);
  check(s.work.size() <= static_cast<size_t>(layout.max_work_items),
        "serialize_decode_schedule: ", s.work.size(), " work items exceed the layout's ",
        layout.max_work_items);
  check(s.merge.size() <= static_cast<size_t>(layout.max_merge_items),
        "serialize_decode_schedule: ", s.merge.size(), " merge items exceed the layout's ",
        layout.max_merge_items);
  const size_t merge_offset = align_up(layout.work + s.work.size() * sizeof(DecodeWorkItem));
  DecodePlanHeader h{};
  h.num_merge_items = static_cast<int>(s.merge.size());
  h.merge_offset = static_cast<int>(merge_offset);
  h.num_work_items = static_cast<int>(s.work.size());
  std::memcpy(dst + layout.header, &h, sizeof(h));
  std::memcpy(dst + layout.cta_work_indptr, s.cta_work_indptr.data(),
              s.cta_work_indptr.size() * sizeof(int));
  if (!s.work.empty()) {
    std::memcpy(dst + layout.work, s.work.data(), s.work.size() * sizeof(DecodeWorkItem));
  }
  if (!s.merge.empty()) {
    std::memcpy(dst + merge_offset, s.merge.data(), s.merge.size() * sizeof(DecodeMergeItem));
  }
  return merge_offset + s.merge.size() * sizeof(DecodeMergeItem);
}

}  // namespace flashkv::scheduler
