// The decode plan's byte image (plan_image.h): its layout in the workspace and the serializer.
#include "scheduler/decode_scheduler.h"

namespace flashkv::scheduler {

DecodePlanLayout decode_plan_layout(int num_ctas, int max_work_items, int max_merge_items) {
  return plan_image_layout<DecodePlanHeader, DecodeWorkItem, DecodeMergeItem>(
      "decode_plan_layout", num_ctas, max_work_items, max_merge_items);
}

size_t serialize_decode_schedule(const DecodeSchedule& s, const DecodePlanLayout& layout,
                                 std::byte* dst) {
  return write_plan_image<DecodePlanHeader, DecodeWorkItem, DecodeMergeItem>(
      "serialize_decode_schedule", layout, s.num_ctas, s.cta_work_indptr, s.work, s.merge,
      DecodePlanHeader{}, dst);
}

}  // namespace flashkv::scheduler
