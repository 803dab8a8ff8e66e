// The prefill plan's byte image (plan_image.h): its layout in the workspace and the serializer.
// The header's fourth field carries tile_rows, so a kernel can check it matches its build.
#include "scheduler/prefill_scheduler.h"

namespace flashkv::scheduler {

PrefillPlanLayout prefill_plan_layout(int num_ctas, int max_work_items, int max_merge_items) {
  return plan_image_layout<PrefillPlanHeader, PrefillWorkItem, PrefillMergeItem>(
      "prefill_plan_layout", num_ctas, max_work_items, max_merge_items);
}

size_t serialize_prefill_schedule(const PrefillSchedule& s, const PrefillPlanLayout& layout,
                                  std::byte* dst) {
  // Prefill launches the layout's full grid: every CTA reads its indptr entries.
  check(s.num_ctas == layout.num_ctas, "serialize_prefill_schedule: the schedule has ", s.num_ctas,
        " CTAs but the layout was made for ", layout.num_ctas);
  PrefillPlanHeader h{};
  h.tile_rows = s.tile_rows;
  return write_plan_image<PrefillPlanHeader, PrefillWorkItem, PrefillMergeItem>(
      "serialize_prefill_schedule", layout, s.num_ctas, s.cta_work_indptr, s.work, s.merge, h, dst);
}

}  // namespace flashkv::scheduler
