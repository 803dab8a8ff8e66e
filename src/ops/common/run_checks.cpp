#include "ops/common/run_checks.h"

#include "flashkv/error.h"

namespace flashkv::ops {

void check_planned_queries(const TensorView& q, const TensorView& out, const TensorView& lse,
                           const PlannedQueries& plan) {
  // Under CUDA graphs q/out/lse may hold more rows than this plan (captured at the config's
  // maximum so later, larger plans still fit); eagerly they must match the plan exactly.
  const auto check_rows = [&](const TensorView& t, const char* what) {
    if (plan.graph ? t.size(0) < plan.rows : t.size(0) != plan.rows) {
      fail(what, ": expected ", plan.graph ? "at least " : "", plan.rows, " rows (", plan.rows_of,
           "), got ", t.size(0));
    }
  };
  for (auto [t, what, dtype] : {std::tuple{&q, "q", plan.q_dtype}, {&out, "out", plan.o_dtype}}) {
    check_device(*t, what, plan.device);
    check_dtype(*t, what, dtype);
    check_ndim(*t, what, 3);
    check_rows(*t, what);
    check_shape(*t, what, {-1, plan.num_qo_heads, plan.head_dim});
    check_last_dim_contiguous(*t, what);
    check_aligned(*t, what, 16);
    check(t->stride(0) % 8 == 0 && t->stride(1) % 8 == 0, what,
          ": row strides must be multiples of 16 bytes");
  }
  check((plan.rows <= 1 || out.stride(0) != 0) && (plan.num_qo_heads <= 1 || out.stride(1) != 0),
        "out: rows must not overlap (zero stride)");
  check(plan.softmax || !lse.defined(),
        "lse: the plan's variant has no softmax (sigmoid attention); pass an undefined lse");
  if (lse.defined()) {
    check_device(lse, "lse", plan.device);
    check_dtype(lse, "lse", DType::f32);
    check_ndim(lse, "lse", 2);
    check_rows(lse, "lse");
    check_shape(lse, "lse", {-1, plan.num_qo_heads});
    check(lse.stride(1) == 1 && (lse.size(0) <= 1 || lse.stride(0) >= plan.num_qo_heads),
          "lse: expected contiguous heads and non-overlapping rows");
    check_aligned(lse, "lse", 4);
  }
}

void check_planned_paged_kv(const PagedKVCache& kv, const PlannedPagedKV& plan) {
  kv.validate_shapes();
  check_device(kv.k, "paged_kv.k", plan.device);
  check_device(kv.indices, "paged_kv.indices", plan.device);
  // The plan's host page ids (if it had them) against this cache: no GPU work.
  check_page_ids_fit(plan.page_ids, kv.num_pages(), plan.kv_indices_name);
  check_dtype(kv.k, "paged_kv.k", plan.kv_dtype);
  check(kv.page_size() == plan.page_size, "paged_kv.page_size: expected ", plan.page_size,
        " (the plan's), got ", kv.page_size());
  check(kv.num_kv_heads() == plan.num_kv_heads, "paged_kv.num_kv_heads: expected ",
        plan.num_kv_heads, " (the plan's), got ", kv.num_kv_heads());
  check(kv.head_dim() == plan.head_dim, "paged_kv.head_dim: expected ", plan.head_dim,
        " (the plan's), got ", kv.head_dim());
  if (plan.graph ? kv.batch_size() < plan.batch : kv.batch_size() != plan.batch) {
    fail("paged_kv batch: expected ", plan.graph ? "at least " : "", plan.batch,
         " requests (the plan's), got ", kv.batch_size());
  }
  // The kernels read kv_indices[0 .. kv_indptr[batch]) with unit stride.
  check(kv.indices.size(0) >= plan.nnz_pages, "paged_kv.indices: expected at least ",
        plan.nnz_pages, " entries (kv_indptr[batch] of the plan), got ", kv.indices.size(0));
  check(kv.indices.size(0) <= 1 || kv.indices.stride(0) == 1,
        "paged_kv.indices: expected a contiguous array");
  check_aligned(kv.indices, "paged_kv.indices", 4);
}

}  // namespace flashkv::ops
