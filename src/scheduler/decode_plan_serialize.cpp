// The decode plan's byte image (plan_image.h): its layout in the workspace and the serializer.
// The indptr is over units of ctas_per_unit CTAs (decode_plan.cuh); the header's fourth field
// carries ctas_per_unit so the image describes itself (the kernels take it as a launch parameter,
// known before any load; the serialization tests read it back).
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
  DecodePlanHeader h{};
  h.ctas_per_unit = s.ctas_per_unit;
  return write_plan_image<DecodePlanHeader, DecodeWorkItem, DecodeMergeItem>(
      "serialize_decode_schedule", layout, s.num_ctas, s.ctas_per_unit, s.unit_work_indptr,
      s.stored_work(), s.merge, h, dst);
}

}  // namespace flashkv::scheduler
