// What run() checks of its tensors against the plan in force, shared by the planned ops (batch
// decode, paged and ragged prefill): each check names the argument and what the plan expected.
#pragma once

#include <cstdint>

#include "flashkv/dtype.h"
#include "flashkv/paged_kv.h"
#include "flashkv/plan_checks.h"
#include "flashkv/tensor.h"

namespace flashkv::ops {

// The query side of a plan: q and out [rows, num_qo_heads, head_dim], lse f32 [rows, num_qo_heads].
struct PlannedQueries {
  Device device;
  DType q_dtype{}, o_dtype{};
  int num_qo_heads = 0, head_dim = 0;
  int64_t rows = 0;          // the plan's query rows
  const char* rows_of = "";  // how messages name them: "the plan's batch"
  bool graph = false;        // enable_cuda_graph: tensors may hold more rows (capture size)
  bool softmax = true;       // the variant has a softmax (else lse must be undefined)
};
// q and out: device, dtype, shape, contiguous last dimension, 16-byte rows, non-overlapping out;
// lse (optional): device, f32, shape, contiguous heads.
void check_planned_queries(const TensorView& q, const TensorView& out, const TensorView& lse,
                           const PlannedQueries& plan);

// The query side of a kernel's parameters (DecodeParams, PrefillParams: the same fields), from
// tensors check_planned_queries accepted.
template <class Params>
void set_query_params(Params& p, const TensorView& q, const TensorView& out,
                      const TensorView& lse) {
  p.q = q.data();
  p.out = out.data();
  p.lse = lse.defined() ? lse.data_as<float>() : nullptr;
  p.q_stride_n = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.o_stride_n = out.stride(0);
  p.o_stride_h = out.stride(1);
  p.lse_stride_n = lse.defined() ? lse.stride(0) : 0;
}

// The KV side of a paged plan.
struct PlannedPagedKV {
  Device device;
  DType kv_dtype{};
  int page_size = 0, num_kv_heads = 0, head_dim = 0;
  int batch = 0;          // requests
  int64_t nnz_pages = 0;  // kv_indptr[batch]: the page-id entries the kernel reads
  PageIdMax page_ids;     // the plan's largest host page id, when it had them
  const char* kv_indices_name = "kv_indices";  // how the message names them (PageTableNames)
  bool graph = false;
};
// The cache's shapes, the index tensor, and the plan's host page ids against its page count.
void check_planned_paged_kv(const PagedKVCache& kv, const PlannedPagedKV& plan);

}  // namespace flashkv::ops
