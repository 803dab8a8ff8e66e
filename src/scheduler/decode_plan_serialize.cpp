// The decode plan's byte image (plan_image.h): its layout in the workspace and the serializer.
#include "scheduler/decode_scheduler.h"

namespace flashkv::scheduler {

DecodePlanLayout decode_plan_layout(int num_ctas, int max_work_items, int max_merge_items) {
  return plan_image_layout<DecodePlanHeader, DecodeWorkItem, DecodeMergeItem>(
      "decode_plan_layout", num_ctas, max_work_items, max_merge_items);
}

size_t serialize_decode_schedule(const DecodeSchedule& s, const DecodePlanLayout& layout,
                                 std::byte* dst) {
  check(!s.work.empty() || s.num_work_items == 0 || dst != nullptr,
        "serialize_decode_schedule: dst is null");
  // Items written to work_out = dst + layout.work by plan_decode are already in place.
  const std::span<const DecodeWorkItem> work =
      !s.work.empty() || s.num_work_items == 0
          ? std::span<const DecodeWorkItem>(s.work)
          : std::span<const DecodeWorkItem>(
                reinterpret_cast<const DecodeWorkItem*>(dst + layout.work),
                static_cast<size_t>(s.num_work_items));
  return write_plan_image<DecodePlanHeader, DecodeWorkItem, DecodeMergeItem>(
      "serialize_decode_schedule", layout, s.num_ctas, s.cta_work_indptr, work, s.merge,
      DecodePlanHeader{}, dst);
}

}  // namespace flashkv::scheduler
