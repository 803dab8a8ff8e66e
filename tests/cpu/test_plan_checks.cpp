// plan()'s argument checks (flashkv/plan_checks.h), the functions the GPU ops' plan() runs and the
// Python wrappers' host path runs too: each refusal names the argument (and the entry) and says
// what was expected; the host target differs from the GPU one only in also taking f32; page ids
// are checked at plan() (>= 0, < num_pages when known) and at run() against the cache.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/test_util.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/plan_checks.h"
#include "flashkv/reference.h"

namespace flashkv {
namespace {

using test::error_of;

constexpr DType kF16 = DType::f16;

// Two requests over pages of 16 tokens: 40 tokens (3 pages) and none.
struct Table {
  std::vector<int32_t> indptr = {0, 3, 3};
  std::vector<int32_t> last = {8, 0};  // request 1 has no pages: its entry is ignored
  std::vector<int32_t> qo = {0, 5, 6};
  int batch = 2;

  void decode(int hq, int hk, int d, int ps, DType q = kF16, DType kv = kF16, DType o = kF16,
              PlanTarget t = PlanTarget::kGpu) const {
    check_decode_plan(indptr.data(), last.data(), batch, hq, hk, d, ps, q, kv, o, t);
  }
  void prefill(int hq, int hk, int d, int ps, bool paged = true, DType q = kF16,
               PlanTarget t = PlanTarget::kGpu) const {
    check_prefill_plan(qo.data(), indptr.data(), paged ? last.data() : nullptr, batch, hq, hk, d,
                       ps, paged, q, q, q, t);
  }
};

TEST(PlanChecks, ValidPlansPass) {
  const Table t;
  for (PlanTarget target : {PlanTarget::kGpu, PlanTarget::kHost}) {
    EXPECT_NO_THROW(t.decode(32, 8, 128, 16, kF16, kF16, kF16, target));
    EXPECT_NO_THROW(t.decode(8, 8, 64, 16, DType::bf16, DType::bf16, DType::bf16, target));
    EXPECT_NO_THROW(t.prefill(32, 8, 256, 16, true, kF16, target));
    EXPECT_NO_THROW(t.prefill(4, 1, 128, 0, false, kF16, target));  // ragged: no page size
  }
  // An empty batch needs no arrays beyond indptr's one entry.
  const int32_t zero = 0;
  EXPECT_NO_THROW(check_decode_plan(&zero, nullptr, 0, 8, 8, 128, 16, kF16, kF16, kF16));
}

// The cases: page_size 0, 7 query heads over 2 KV heads, head_dim 100.
TEST(PlanChecks, DecodeRefusesWhatTheGpuCannotRun) {
  const Table t;
  for (PlanTarget target : {PlanTarget::kGpu, PlanTarget::kHost}) {
    SCOPED_TRACE(target == PlanTarget::kGpu ? "gpu" : "host");
    EXPECT_ERROR_HAS(t.decode(8, 8, 128, 0, kF16, kF16, kF16, target),
                     "page_size: expected >= 1, got 0");
    EXPECT_ERROR_HAS(t.decode(7, 2, 128, 16, kF16, kF16, kF16, target),
                     "num_qo_heads = 7 is not divisible by num_kv_heads = 2");
    EXPECT_ERROR_HAS(t.decode(8, 0, 128, 16, kF16, kF16, kF16, target), "num_kv_heads = 0");
    EXPECT_ERROR_HAS(t.decode(8, 8, 100, 16, kF16, kF16, kF16, target),
                     "head_dim: expected 64, 128 or 256, got 100");
    EXPECT_ERROR_HAS(t.decode(128, 1, 128, 16, kF16, kF16, kF16, target),
                     "expected a GQA group of at most 64, got 128");
    EXPECT_ERROR_HAS(t.decode(8, 8, 128, 16, kF16, DType::bf16, kF16, target),
                     "kv_dtype: expected f16 (the q dtype) or an fp8 dtype (e4m3, e5m2), got bf16");
    EXPECT_ERROR_HAS(t.decode(8, 8, 128, 16, kF16, kF16, DType::bf16, target),
                     "o_dtype: expected f16 (the q dtype), got bf16");
    EXPECT_ERROR_HAS(t.decode(8, 8, 128, 16, DType::i32, DType::i32, DType::i32, target),
                     "q_dtype: expected f16");
  }
  // f32: the CPU reference's, not the GPU kernels'.
  EXPECT_ERROR_HAS(t.decode(8, 8, 128, 16, DType::f32, DType::f32, DType::f32, PlanTarget::kGpu),
                   "q_dtype: expected f16 or bf16, got f32");
  EXPECT_NO_THROW(t.decode(8, 8, 128, 16, DType::f32, DType::f32, DType::f32, PlanTarget::kHost));
}

TEST(PlanChecks, PageTableEntriesAreNamed) {
  Table t;
  t.indptr = {1, 3, 3};
  EXPECT_ERROR_HAS(t.decode(8, 8, 128, 16), "kv_indptr[0]: expected 0, got 1");
  t.indptr = {0, 3, 2};
  EXPECT_ERROR_HAS(t.decode(8, 8, 128, 16), "kv_indptr[2] = 2: expected >= kv_indptr[1] = 3");
  t.indptr = {0, 3, 3};
  t.last = {17, 0};
  EXPECT_ERROR_HAS(t.decode(8, 8, 128, 16),
                   "kv_last_page_len[0] = 17: expected 1 <= value <= 16 (page_size)");
  t.last = {0, 0};
  EXPECT_ERROR_HAS(t.decode(8, 8, 128, 16), "kv_last_page_len[0] = 0");
  t.last = {16, -5};  // request 1 has no pages: ignored
  EXPECT_NO_THROW(t.decode(8, 8, 128, 16));
  EXPECT_ERROR_HAS(check_decode_plan(nullptr, t.last.data(), 2, 8, 8, 128, 16, kF16, kF16, kF16),
                   "kv_indptr: expected a host array");
  EXPECT_ERROR_HAS(check_decode_plan(t.indptr.data(), nullptr, 2, 8, 8, 128, 16, kF16, kF16, kF16),
                   "kv_last_page_len: expected a host array");
  EXPECT_ERROR_HAS(
      check_decode_plan(t.indptr.data(), t.last.data(), -1, 8, 8, 128, 16, kF16, kF16, kF16),
      "batch_size: expected >= 0, got -1");
  // The Python wrappers name FlashInfer's arguments.
  t.indptr = {0, 3, 2};
  PageTableNames names;
  names.kv_indptr = "indptr";
  EXPECT_ERROR_HAS(check_decode_plan(t.indptr.data(), t.last.data(), 2, 8, 8, 128, 16, kF16, kF16,
                                     kF16, PlanTarget::kHost, names),
                   "indptr[2] = 2: expected >= indptr[1] = 3");
}

TEST(PlanChecks, PrefillChecksQueriesAndGroups) {
  Table t;
  EXPECT_ERROR_HAS(t.prefill(7, 2, 128, 16),
                   "num_qo_heads = 7 is not divisible by num_kv_heads = 2");
  EXPECT_ERROR_HAS(t.prefill(8, 8, 100, 16), "head_dim: expected 64, 128 or 256, got 100");
  EXPECT_ERROR_HAS(t.prefill(8, 8, 128, 0), "page_size: expected >= 1, got 0");
  EXPECT_NO_THROW(t.prefill(128, 1, 128, 16));  // prefill takes groups up to 128
  EXPECT_ERROR_HAS(t.prefill(256, 1, 128, 16), "expected a GQA group of at most 128, got 256");
  t.qo = {0, 5, 4};
  EXPECT_ERROR_HAS(t.prefill(8, 8, 128, 16), "qo_indptr[2] = 4: expected >= qo_indptr[1] = 5");
  EXPECT_ERROR_HAS(t.prefill(8, 8, 128, 16, false), "qo_indptr[2] = 4");
  t.qo = {0, 5, 6};
  t.last = {20, 0};
  EXPECT_ERROR_HAS(t.prefill(8, 8, 128, 16), "kv_last_page_len[0] = 20");
  EXPECT_NO_THROW(t.prefill(8, 8, 128, 16, false));  // ragged: no last_page_len
  t.indptr = {0, 5, 4};
  EXPECT_ERROR_HAS(t.prefill(8, 8, 128, 16, false), "kv_indptr[2] = 4: expected >= kv_indptr[1]");
}

TEST(PlanChecks, PageIdsAtPlanAndAtRun) {
  const std::vector<int32_t> ids = {4, 0, 9, 1, 7};
  // num_pages known at plan(): the first id out of range is named.
  EXPECT_NO_THROW(check_page_ids(ids.data(), 5, 10));
  EXPECT_ERROR_HAS(check_page_ids(ids.data(), 5, 9),
                   "kv_indices[2] = 9 is out of range [0, num_pages): expected 0 <= page id < 9");
  // Not known (0): negative ids are refused now, the largest is kept for run().
  const std::vector<int32_t> negative = {4, 0, -1, 1};
  EXPECT_ERROR_HAS(check_page_ids(negative.data(), 4, 0, "paged_kv_indices"),
                   "paged_kv_indices[2] = -1 is out of range [0, num_pages)");
  const PageIdMax m = check_page_ids(ids.data(), 5, 0);
  EXPECT_EQ(m.id, 9);
  EXPECT_EQ(m.entry, 2);
  EXPECT_NO_THROW(check_page_ids_fit(m, 10));
  EXPECT_ERROR_HAS(check_page_ids_fit(m, 9),
                   "kv_indices[2] = 9 is out of range [0, num_pages): the paged KV cache given to "
                   "run() has 9 pages");
  EXPECT_ERROR_HAS(check_page_ids_fit(m, 4, "indices"), "indices[2] = 9");
  // Only the first n entries are the table's.
  EXPECT_NO_THROW(check_page_ids_fit(check_page_ids(ids.data(), 2, 0), 5));
  // No pages (or no host table): nothing to check at run().
  const PageIdMax none = check_page_ids(nullptr, 0, 0);
  EXPECT_LT(none.entry, 0);
  EXPECT_NO_THROW(check_page_ids_fit(none, 0));
  EXPECT_NO_THROW(check_page_ids_fit(PageIdMax{}, 1));
  EXPECT_ERROR_HAS(check_page_ids(nullptr, 3, 0), "kv_indices: expected a host array of 3 entries");
}

TEST(PlanChecks, CascadeChecksTableShapeAndIds) {
  const std::vector<int32_t> indptr = {0, 3, 5}, last = {4, 16}, indices = {7, 1, 2, 7, 3};
  CascadeBatch b;
  b.kv_indptr = indptr.data();
  b.kv_indices = indices.data();
  b.kv_last_page_len = last.data();
  b.batch_size = 2;
  b.page_size = 16;
  CascadeShape s{32, 8, 128, kF16};
  const PageIdMax m = check_cascade_plan(b, s);
  EXPECT_EQ(m.id, 7);
  EXPECT_EQ(m.entry, 0);
  CascadeShape bad = s;
  bad.num_qo_heads = 7;
  bad.num_kv_heads = 2;
  EXPECT_ERROR_HAS(check_cascade_plan(b, bad), "num_qo_heads = 7 is not divisible");
  bad = s;
  bad.head_dim = 100;
  EXPECT_ERROR_HAS(check_cascade_plan(b, bad), "head_dim: expected 64, 128 or 256, got 100");
  bad = s;
  bad.dtype = DType::f32;
  EXPECT_ERROR_HAS(check_cascade_plan(b, bad), "CascadeShape.dtype: expected f16 or bf16, got f32");
  EXPECT_NO_THROW(check_cascade_plan(b, bad, PlanTarget::kHost));
  bad.dtype = kF16;
  bad.num_qo_heads = 128;  // group 128: decode's limit is 64, prefill rows' 128
  bad.num_kv_heads = 1;
  EXPECT_ERROR_HAS(check_cascade_plan(b, bad), "GQA group of at most 64");
  const std::vector<int32_t> qo = {0, 2, 3};
  CascadeBatch rows = b;
  rows.qo_indptr = qo.data();
  EXPECT_NO_THROW(check_cascade_plan(rows, bad));
  CascadeBatch p = b;
  p.page_size = 0;
  EXPECT_ERROR_HAS(check_cascade_plan(p, s), "page_size: expected >= 1, got 0");
  const std::vector<int32_t> negative = {7, 1, -3, 7, 3};
  p = b;
  p.kv_indices = negative.data();
  EXPECT_ERROR_HAS(check_cascade_plan(p, s), "kv_indices[2] = -3 is out of range");
  p.kv_indices = nullptr;  // the caller checks the ids itself
  EXPECT_LT(check_cascade_plan(p, s).entry, 0);
}

// single_decode / single_prefill with k in the other layout than kv_layout says: the message
// names the layout and the shape it expects (not only "8 is not divisible by 10").
TEST(PlanChecks, ContiguousKvHeadsNameTheLayout) {
  const TensorView nhd(nullptr, kF16, {10, 2, 64});  // [kv_len 10, 2 heads, 64]
  EXPECT_NO_THROW(check_contiguous_kv_heads(nhd, KVLayout::NHD, 8));
  EXPECT_ERROR_HAS(check_contiguous_kv_heads(nhd, KVLayout::HND, 8),
                   "k: with kv_layout 'HND' expected [num_kv_heads, kv_len, head_dim], got shape "
                   "[10, 2, 64]");
  EXPECT_ERROR_HAS(check_contiguous_kv_heads(nhd, KVLayout::HND, 8),
                   "num_qo_heads = 8 is not divisible by num_kv_heads = 10");
  const auto [kv_len, heads] = check_contiguous_kv_heads(nhd, KVLayout::HND, 20);
  EXPECT_EQ(kv_len, 2);
  EXPECT_EQ(heads, 10);

  // Through the CPU reference (what the Python host path runs).
  HostTensor q(kF16, {8, 64}), k(kF16, {10, 2, 64}), v(kF16, {10, 2, 64}), out(kF16, {8, 64});
  EXPECT_ERROR_HAS(reference::single_decode(q.view(), k.view(), v.view(), out.view(), TensorView(),
                                            KVLayout::HND),
                   "k: with kv_layout 'HND' expected [num_kv_heads, kv_len, head_dim]");
  HostTensor q3(kF16, {3, 8, 64}), out3(kF16, {3, 8, 64});
  EXPECT_ERROR_HAS(reference::single_prefill(q3.view(), k.view(), v.view(), out3.view(),
                                             TensorView(), KVLayout::HND),
                   "with kv_layout 'HND'");
}

}  // namespace
}  // namespace flashkv
