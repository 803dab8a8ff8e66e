// The decode plan's byte image (plan_image.h): its layout in the workspace and the serializer.
#include "scheduler/decode_scheduler.h"

namespace flashkv::scheduler {

DecodePlanLayout decode_plan_layout(int num_ctas, int max_work_items, int max_merge_items) {
  return plan_image_layout<DecodePlanHeader, DecodeWorkItem, DecodeMergeItem>(
      "decode_plan_layout", num_ctas, max_work_items, max_merge_items);
}

size_t serialize_decode_schedule(const DecodeSchedule& s, const DecodePlanLayout& layout,
                                 std::byte* dst) {
  // Items written by plan_decode to work_out are copied from there (not at all when work_out is
  // this image's work array: they are in place).
  const std::span<const DecodeWorkItem> work =
      s.work_out != nullptr
          ? std::span<const DecodeWorkItem>(s.work_out, static_cast<size_t>(s.num_work_items))
          : std::span<const DecodeWorkItem>(s.work);
  return write_plan_image<DecodePlanHeader, DecodeWorkItem, DecodeMergeItem>(
      "serialize_decode_schedule", layout, s.num_ctas, s.cta_work_indptr, work, s.merge,
      DecodePlanHeader{}, dst);
}

}  // namespace flashkv::scheduler
