// Batch prefill (paged and ragged KV) and single_prefill on the GPU vs the CPU reference, across
// the shapes users have: causal and not, appends (qo_len < kv_len), qo_len 1, qo_len > kv_len,
// empty requests, odd lengths, page sizes 1/5/16/64, NHD/HND/interleaved, GQA groups 1/4/8/32,
// head_dim 64/128/256, f16 and bf16, explicit query tiles and split options, split-KV with its
// merge, and one 32768-token causal prompt.
//
// Every output is checked with the tolerance rule of tests/common/test_util.h, every lse within
// 1e-4 relative, and every (row, head) that sees no key must be exactly out = 0, lse = -inf.
// Outputs are poisoned with NaN before each run, so a row the kernel forgot to write fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "flashkv/reference.h"
#include "gpu/prefill_case.h"
#include "ops/prefill/prefill_kernel.h"  // default_prefill_tile_rows: what tile_rows = 0 must pick

namespace flashkv::test {
namespace {

class PrefillGpu : public GpuTest {};

using Requests = PrefillRequests;

// Self-attention prompts (qo == kv), appends (qo < kv), a decode row (qo 1), a request with no
// queries (qo 0), one with no KV (kv 0: every row empty), one with qo > kv (causal: the first 27
// rows see nothing), and lengths that are not multiples of any tile or page.
const Requests kMixed = {{17, 17}, {1, 300},   {113, 500}, {0, 9},
                         {7, 0},   {250, 250}, {40, 13},   {1, 1}};

TEST_F(PrefillGpu, HeadDimsGroupsPagesLayoutsDtypes) {
  // 8 query heads over 8, 2 and 1 KV heads: GQA groups 1, 4 and 8.
  const int kv_heads[] = {8, 2, 1};
  for_each_matrix_case(kMixed, 8, kv_heads, 100, [&](const PrefillCase& c) {
    const PrefillInputs in = make_prefill_inputs(c);
    // Paged, then ragged KV on the same data (one reference for both).
    expect_prefill_ok(in, run_prefill(in, PrefillKV::kPaged), "paged");
    expect_prefill_ok(in, run_prefill(in, PrefillKV::kRagged), "ragged");
  });
}

TEST_F(PrefillGpu, OddLengthsSelfAttentionAndAppend) {
  const std::vector<int64_t> odd = {1, 17, 113, 577, 1023};
  uint64_t seed = 200;
  for (bool causal : {false, true}) {
    for (bool append : {false, true}) {
      PrefillCase c;
      c.qo_lens = odd;
      // Appends: the same queries after a longer context (chunked prefill, speculative decoding).
      c.kv_lens = append ? std::vector<int64_t>{1023, 577, 1023, 1100, 1100} : odd;
      c.dtype = append ? DType::bf16 : DType::f16;
      c.page_size = append ? 5 : 16;
      c.layout = append ? KVLayout::HND : KVLayout::NHD;
      c.opts.causal = causal;
      c.seed = seed++;
      check_prefill_case(c);
    }
  }
}

// Causal with qo_len > kv_len: query i sees KV positions <= kv_len - qo_len + i, so the first
// qo_len - kv_len rows see nothing and must be out = 0, lse = -inf.
TEST_F(PrefillGpu, QueryLongerThanKvFirstRowsSeeNothing) {
  const Requests reqs = {{64, 10}, {17, 1}, {200, 199}, {5, 0}, {33, 32}, {16, 16}};
  struct Shape {
    DType dt;
    int hqo, hkv, d;
  };
  uint64_t seed = 300;
  for (Shape sh : {Shape{DType::f16, 8, 2, 128}, Shape{DType::bf16, 8, 8, 64}}) {
    for (bool causal : {true, false}) {
      PrefillCase c;
      c.set_requests(reqs);
      c.dtype = sh.dt;
      c.num_qo_heads = sh.hqo;
      c.num_kv_heads = sh.hkv;
      c.head_dim = sh.d;
      c.opts.causal = causal;
      c.seed = seed++;
      int64_t expected_empty = 0;  // rows that see nothing, per head
      for (auto [qo, kv] : reqs)
        expected_empty += causal ? std::max<int64_t>(0, qo - kv) : (kv ? 0 : qo);
      const PrefillInputs in = make_prefill_inputs(c);
      for (PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
        const PrefillOutcome o = run_prefill(in, kv);
        expect_prefill_ok(in, o, prefill_kv_name(kv));
        EXPECT_EQ(o.empty_rows, expected_empty * c.num_qo_heads)
            << c.str() << ": the reference disagrees with the causal alignment of attention.h";
      }
    }
  }
}

// Every page size x layout x interleaving on the same logical data (so one reference).
TEST_F(PrefillGpu, PageSizesLayoutsInterleaving) {
  PrefillCase base;
  base.set_requests({{33, 100}, {1, 64}, {64, 64}, {7, 0}, {100, 513}, {2, 1}});
  base.opts.causal = true;
  base.seed = 400;
  const PrefillInputs ref = make_prefill_inputs(base);
  for (int page : {1, 5, 16, 64}) {
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
      for (bool inter : {false, true}) {
        PrefillCase c = base;
        c.page_size = page;
        c.layout = layout;
        c.interleaved = inter;
        const PrefillInputs in = make_prefill_inputs(c, &ref);
        expect_prefill_ok(in, run_prefill(in), "paged");
      }
    }
  }
}

// 32 query heads on one KV head: a query tile of 32 rows holds one token, of 128 rows four.
TEST_F(PrefillGpu, MqaGroup32AllTileRows) {
  uint64_t seed = 500;
  for (DType dt : {DType::f16, DType::bf16}) {
    PrefillCase c;
    c.set_requests({{1, 500}, {17, 17}, {100, 300}, {0, 3}, {5, 2}, {3, 40}});
    c.num_qo_heads = 32;
    c.num_kv_heads = 1;
    c.dtype = dt;
    c.opts.causal = true;
    c.seed = seed++;
    const PrefillInputs in = make_prefill_inputs(c);
    for (int tile : {0, 32, 64, 128}) {
      PrefillPlanOptions opts = c.opts;
      opts.tile_rows = tile;
      const PrefillOutcome o = run_prefill(in, PrefillKV::kPaged, opts);
      expect_prefill_ok(in, o, "tile_rows " + std::to_string(tile));
      EXPECT_EQ(o.plan.tile_rows, tile ? tile : ops::default_prefill_tile_rows(c.qo_lens, 32));
    }
  }
}

// Every kernel specialization (dtype x head_dim x query tile) on one small batch, paged and ragged.
TEST_F(PrefillGpu, EveryKernelSpecialization) {
  uint64_t seed = 550;
  for (DType dt : {DType::f16, DType::bf16}) {
    for (int d : {64, 128, 256}) {
      PrefillCase c;
      c.set_requests({{1, 70}, {19, 19}, {40, 100}, {3, 0}, {70, 33}});
      c.dtype = dt;
      c.head_dim = d;
      c.opts.causal = true;
      c.seed = seed++;
      const PrefillInputs in = make_prefill_inputs(c);
      for (int tile : {16, 32, 64, 128}) {
        PrefillPlanOptions opts = c.opts;
        opts.tile_rows = tile;
        for (PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
          const PrefillOutcome o = run_prefill(in, kv, opts);
          expect_prefill_ok(
              in, o, std::string(prefill_kv_name(kv)) + " tile_rows " + std::to_string(tile));
          EXPECT_EQ(o.plan.tile_rows, tile);
        }
      }
    }
  }
}

// Explicit query tiles and the heuristic, each with dynamic split-KV, fixed_split_size and no
// split, on one batch (one reference).
TEST_F(PrefillGpu, TileRowsAndSplitOptions) {
  PrefillCase c;
  c.set_requests({{1, 1}, {17, 17}, {113, 600}, {5, 0}, {64, 10}, {150, 1500}, {1, 3000}});
  c.opts.causal = true;
  c.seed = 600;
  const PrefillInputs in = make_prefill_inputs(c);
  for (int tile : {0, 16, 32, 64, 128}) {
    for (int split : {0, 1, 2}) {  // dynamic, fixed 1000, disabled
      PrefillPlanOptions opts = c.opts;
      opts.tile_rows = tile;
      opts.fixed_split_size = split == 1 ? 1000 : 0;
      opts.disable_split_kv = split == 2;
      const std::string what = "tile_rows " + std::to_string(tile) +
                               (split == 1   ? " fixed_split 1000"
                                : split == 2 ? " nosplit"
                                             : "");
      const PrefillOutcome o = run_prefill(in, PrefillKV::kPaged, opts);
      expect_prefill_ok(in, o, what);
      EXPECT_EQ(o.plan.tile_rows, tile ? tile : ops::default_prefill_tile_rows(c.qo_lens, 4))
          << what;
      if (split == 1) {
        // The (1, 3000) request's tile sees 3000 tokens: three chunks of at most 1000.
        EXPECT_GT(o.plan.num_split_tiles, 0) << what;
      }
      if (split == 2) {
        EXPECT_EQ(o.plan.num_split_tiles, 0) << what;
      }
    }
  }
  // The heuristic on the ragged wrapper too.
  expect_prefill_ok(in, run_prefill(in, PrefillKV::kRagged), "ragged");
}

// Small fixed chunks: many partial states per tile go through the merge.
TEST_F(PrefillGpu, SmallFixedSplitSizes) {
  PrefillCase c;
  c.set_requests({{3, 200}, {16, 300}, {1, 257}, {9, 0}, {20, 20}});
  c.dtype = DType::bf16;
  c.head_dim = 64;
  c.opts.causal = true;
  c.opts.tile_rows = 64;
  c.seed = 650;
  const PrefillInputs in = make_prefill_inputs(c);
  for (int fixed : {64, 127}) {
    for (PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
      PrefillPlanOptions opts = c.opts;
      opts.fixed_split_size = fixed;
      const PrefillOutcome o = run_prefill(in, kv, opts);
      expect_prefill_ok(in, o,
                        std::string(prefill_kv_name(kv)) + " fixed_split " + std::to_string(fixed));
      EXPECT_GT(o.plan.num_split_tiles, 0);
    }
  }
}

// Few query tiles over a long KV: the scheduler must split the KV across CTAs, so the partial
// states and their merge are on the path being checked.
TEST_F(PrefillGpu, LongKvFewTilesSplitsAcrossCtas) {
  uint64_t seed = 700;
  for (DType dt : {DType::f16, DType::bf16}) {
    for (bool causal : {true, false}) {
      PrefillCase c;
      c.set_requests({{16, 8192}});
      c.dtype = dt;
      c.opts.causal = causal;
      c.seed = seed++;
      const PrefillInputs in = make_prefill_inputs(c);
      for (PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
        const PrefillOutcome o = run_prefill(in, kv);
        expect_prefill_ok(in, o, prefill_kv_name(kv));
        EXPECT_GT(o.plan.num_split_tiles, 0)
            << c.str() << ": 16 queries over 8192 keys must be split (split-KV)";
        EXPECT_GT(o.plan.num_work_items, o.plan.num_split_tiles);
      }
    }
  }
  // Split tiles next to unsplit ones, decode rows among prefill rows.
  PrefillCase c;
  c.set_requests({{16, 8192}, {1, 20000}, {3, 5}, {128, 4096}, {0, 100}});
  c.dtype = DType::bf16;
  c.page_size = 64;
  c.layout = KVLayout::HND;
  c.opts.causal = true;
  c.seed = seed++;
  const PrefillOutcome o = check_prefill_case(c);
  EXPECT_GT(o.plan.num_split_tiles, 0);
}

TEST_F(PrefillGpu, MixedBatchWithEverything) {
  PrefillCase c;
  c.set_requests(
      {{1, 1}, {17, 17}, {113, 313}, {0, 9}, {5, 0}, {577, 1023}, {64, 10}, {1, 4000}, {2, 2}});
  c.num_qo_heads = 8;
  c.num_kv_heads = 1;
  c.head_dim = 256;
  c.page_size = 5;
  c.layout = KVLayout::HND;
  c.interleaved = true;
  c.dtype = DType::bf16;
  c.opts.causal = true;
  c.seed = 800;
  const PrefillInputs in = make_prefill_inputs(c);
  expect_prefill_ok(in, run_prefill(in, PrefillKV::kPaged), "paged");
  expect_prefill_ok(in, run_prefill(in, PrefillKV::kRagged), "ragged");
}

TEST_F(PrefillGpu, AllEmptyAndTinyBatches) {
  const Requests batches[] = {{{1, 0}},
                              {{3, 0}, {1, 0}, {2, 0}},
                              {{1, 1}},
                              {{1, 1}, {1, 1}, {1, 1}, {1, 1}},
                              {{0, 5}, {1, 1}, {0, 0}}};
  uint64_t seed = 900;
  for (const Requests& reqs : batches) {
    for (bool causal : {false, true}) {
      PrefillCase c;
      c.set_requests(reqs);
      c.opts.causal = causal;
      c.seed = seed++;
      const PrefillInputs in = make_prefill_inputs(c);
      for (PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
        expect_prefill_ok(in, run_prefill(in, kv), prefill_kv_name(kv));
      }
    }
  }
}

TEST_F(PrefillGpu, SmScaleAndOptionalLse) {
  PrefillCase c;
  c.set_requests({{33, 70}, {1, 129}, {50, 50}, {4, 0}});
  c.opts.causal = true;
  c.opts.sm_scale = 0.3f;
  c.seed = 950;
  check_prefill_case(c);
  c.opts.causal = false;
  c.with_lse = false;
  c.seed = 951;
  const PrefillInputs in = make_prefill_inputs(c);
  for (PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
    expect_prefill_ok(in, run_prefill(in, kv), prefill_kv_name(kv));
  }
}

// BatchPrefillRagged on the ragged copy of the KV agrees with the reference (and the reference's
// own ragged and paged ops agree exactly on the test data, which is what lets every ragged run
// here be checked against the paged reference).
TEST_F(PrefillGpu, RaggedKvMatchesReference) {
  struct Shape {
    DType dt;
    int hqo, hkv, d;
    bool causal;
  };
  uint64_t seed = 1000;
  for (Shape sh : {Shape{DType::f16, 8, 8, 64, false}, Shape{DType::bf16, 8, 1, 256, true},
                   Shape{DType::f16, 8, 2, 128, false}, Shape{DType::bf16, 32, 4, 128, true}}) {
    PrefillCase c;
    c.set_requests({{17, 17}, {0, 33}, {113, 400}, {9, 0}, {1, 1000}, {30, 20}});
    c.dtype = sh.dt;
    c.num_qo_heads = sh.hqo;
    c.num_kv_heads = sh.hkv;
    c.head_dim = sh.d;
    c.opts.causal = sh.causal;
    c.seed = seed++;
    const PrefillInputs in = make_prefill_inputs(c);

    HostTensor ref(DType::f32, in.ref.shape()), ref_lse(DType::f32, in.ref_lse.shape());
    AttentionOptions ao;
    ao.causal = c.opts.causal;
    reference::batch_prefill_ragged(in.q.view(), in.qo_indptr.view(), in.cache.k_ragged.view(),
                                    in.cache.v_ragged.view(), in.cache.kv_indptr.view(), ref.view(),
                                    ref_lse.view(), ao);
    EXPECT_EQ(rel_err(ref.to_doubles(), in.ref.to_doubles()), 0.0) << c.str();
    EXPECT_EQ(rel_err(ref_lse.to_doubles(), in.ref_lse.to_doubles()), 0.0) << c.str();

    expect_prefill_ok(in, run_prefill(in, PrefillKV::kRagged), "ragged");
    PrefillPlanOptions opts = c.opts;
    opts.disable_split_kv = true;
    expect_prefill_ok(in, run_prefill(in, PrefillKV::kRagged, opts), "ragged nosplit");
    opts.disable_split_kv = false;
    opts.fixed_split_size = 256;
    opts.tile_rows = 128;
    expect_prefill_ok(in, run_prefill(in, PrefillKV::kRagged, opts), "ragged fixed_split 256");
  }
}

// single_prefill on GPU tensors (the library plans on every call) vs reference::single_prefill.
TEST_F(PrefillGpu, SinglePrefillNhdHnd) {
  struct Shape {
    int64_t qo, kv;
    bool causal;
  };
  const Shape shapes[] = {{1, 1, false},  {113, 113, true}, {17, 577, true}, {17, 577, false},
                          {64, 10, true}, {5, 0, false},    {1, 2000, true}, {300, 1023, true}};
  const int Hq = 8, Hkv = 2, D = 128;
  uint64_t seed = 1100;
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    const DType dt = layout == KVLayout::NHD ? DType::f16 : DType::bf16;
    for (const Shape& sh : shapes) {
      const std::string tag = std::string("single_prefill ") + kv_layout_name(layout) + " " +
                              dtype_name(dt) + " qo " + std::to_string(sh.qo) + " kv " +
                              std::to_string(sh.kv) + (sh.causal ? " causal" : "");
      HostTensor q(dt, {sh.qo, Hq, D});
      q.fill_random(seed++);
      const std::vector<int64_t> kshape = layout == KVLayout::NHD
                                              ? std::vector<int64_t>{sh.kv, Hkv, D}
                                              : std::vector<int64_t>{Hkv, sh.kv, D};
      HostTensor k(dt, kshape), v(dt, kshape);
      if (sh.kv > 0) {
        k.fill_random(seed++);
        v.fill_random(seed++);
      }
      AttentionOptions ao;
      ao.causal = sh.causal;
      HostTensor ref(DType::f32, {sh.qo, Hq, D}), ref_lse(DType::f32, {sh.qo, Hq});
      reference::single_prefill(q.view(), k.view(), v.view(), ref.view(), ref_lse.view(), layout,
                                ao);
      const auto dq = to_device(q), dk = to_device(k), dv = to_device(v);
      HostTensor out(dt, {sh.qo, Hq, D}), lse(DType::f32, {sh.qo, Hq});
      const auto dout = poisoned_like(out), dlse = poisoned_like(lse);
      single_prefill(dq.view, dk.view, dv.view, dout.view, dlse.view, layout, ao);
      synchronize();
      to_host(dout, out);
      to_host(dlse, lse);
      EXPECT_TRUE(matches_reference(out.to_doubles(), ref.to_doubles(),
                                    rounded_to(ref, dt).to_doubles(), dt))
          << tag;
      EXPECT_FALSE(any_nan(lse.to_doubles())) << tag;
      EXPECT_LE(rel_err(lse.to_doubles(), ref_lse.to_doubles()), 1e-4) << tag;
      EXPECT_EQ(count_bad_empty_rows(out, &lse, ref_lse), 0) << tag;
    }
  }
}

// One 32768-token causal prompt (4 query heads on 1 KV head). The reference cannot afford all of
// it: it parallelizes over (request, KV head) pairs, of which there is one, at about 0.9 ns per
// (row, key, head, dim) on the dev VM, so ~250 s. Instead it computes sampled blocks of N query
// rows exactly: rows [a, a + N) of the prompt are a request of qo_len N over the first a + N KV
// tokens, because with the causal mask aligned to the end of the KV its row j sees positions
// <= (a + N) - N + j = a + j, which is what prompt row a + j sees. (On the reference itself, at
// L = 3000, the block rows equal the full prompt's rows bit for bit.) The block requests read the
// prompt's own pages (a prefix of its page table), so the KV is the same memory, not a copy. All
// rows are checked for NaN and for a finite lse (every row of a causal prompt sees key 0).
TEST_F(PrefillGpu, Single32kCausalPromptSampledRows) {
  const int64_t L = 32768, N = 48;
  const int Hq = 4, Hkv = 1, D = 128, page = 16;
  const DType dt = DType::f16;
  const PagedCacheHost cache = make_paged_cache({L}, page, Hkv, D, KVLayout::NHD, dt, 1201);
  HostTensor q(dt, {L, Hq, D});
  q.fill_random(1202);

  // The GPU runs the whole prompt.
  const DeviceCache dcache = to_device(cache);
  const DeviceTensor dq = to_device(q);
  HostTensor out(dt, {L, Hq, D}), lse(DType::f32, {L, Hq});
  const DeviceTensor dout = poisoned_like(out), dlse = poisoned_like(lse);
  const BatchPrefillConfig cfg = prefill_config(1, L, Hq, D);
  DeviceBuffer ws(BatchPrefillPaged::workspace_bytes(cfg));
  BatchPrefillPaged pf(cfg, ws.data(), ws.size());
  PrefillPlanOptions opts;
  opts.causal = true;
  const HostTensor qo_indptr = indptr_of({L});
  {
    ScopedStream s;
    pf.plan({.qo_indptr = qo_indptr.view().data_as<int32_t>(),
             .kv_indptr = cache.indptr.view().data_as<int32_t>(),
             .kv_last_page_len = cache.last_page_len.view().data_as<int32_t>(),
             .batch_size = 1,
             .page_size = page},
            {.num_qo_heads = Hq,
             .num_kv_heads = Hkv,
             .head_dim = D,
             .q_dtype = dt,
             .kv_dtype = dt,
             .o_dtype = dt},
            opts, s);
    pf.run(dq.view, dcache.cache, dout.view, dlse.view, s);
    synchronize(s);
  }
  to_host(dout, out);
  to_host(dlse, lse);
  int64_t out_nan = 0, lse_not_finite = 0;
  for (int64_t i = 0; i < out.numel(); ++i) out_nan += std::isnan(out.get(i)) ? 1 : 0;
  for (int64_t i = 0; i < lse.numel(); ++i) lse_not_finite += std::isfinite(lse.get(i)) ? 0 : 1;
  EXPECT_EQ(out_nan, 0) << "output elements left unwritten (NaN)";
  EXPECT_EQ(lse_not_finite, 0) << "(row, head) pairs with a non-finite lse";

  // The reference on the sampled blocks, all in one batch (parallel over the blocks).
  const std::vector<int64_t> starts = {0, 1000, 4093, 8191, 16411, 24000, L - N};
  const int64_t nb = static_cast<int64_t>(starts.size());
  const int32_t* prompt_pages = cache.indices.view().data_as<int32_t>();
  std::vector<int64_t> indptr{0}, indices, last;
  for (int64_t a : starts) {
    const int64_t kv = a + N, pages = (kv + page - 1) / page;
    for (int64_t p = 0; p < pages; ++p) indices.push_back(prompt_pages[p]);
    indptr.push_back(indptr.back() + pages);
    last.push_back(kv - (pages - 1) * page);
  }
  const HostTensor b_indptr = make_i32(indptr), b_indices = make_i32(indices),
                   b_last = make_i32(last);
  PagedKVCache blocks = cache.cache;
  blocks.indptr = b_indptr.view();
  blocks.indices = b_indices.view();
  blocks.last_page_len = b_last.view();
  const int64_t row_elems = Hq * D, row_bytes = row_elems * static_cast<int64_t>(dtype_size(dt));
  HostTensor qb(dt, {nb * N, Hq, D});
  for (int64_t b = 0; b < nb; ++b) {
    std::memcpy(static_cast<char*>(qb.data()) + b * N * row_bytes,
                static_cast<const char*>(q.data()) + starts[b] * row_bytes, N * row_bytes);
  }
  HostTensor ref(DType::f32, {nb * N, Hq, D}), ref_lse(DType::f32, {nb * N, Hq});
  AttentionOptions ao;
  ao.causal = true;
  reference::batch_prefill_paged(qb.view(), indptr_of(std::vector<int64_t>(nb, N)).view(), blocks,
                                 ref.view(), ref_lse.view(), ao);

  for (int64_t b = 0; b < nb; ++b) {
    std::vector<double> got, want, want_lowp, got_lse, want_lse;
    for (int64_t e = 0; e < N * row_elems; ++e) {
      got.push_back(out.get(starts[b] * row_elems + e));
      want.push_back(ref.get(b * N * row_elems + e));
      uint32_t bits = 0;  // the reference value rounded to the dtype (the ref_lowp of the rule)
      store_from_double(&bits, dt, 0, want.back());
      want_lowp.push_back(load_as_double(&bits, dt, 0));
    }
    for (int64_t e = 0; e < N * Hq; ++e) {
      got_lse.push_back(lse.get(starts[b] * Hq + e));
      want_lse.push_back(ref_lse.get(b * N * Hq + e));
    }
    const std::string tag =
        "prompt rows [" + std::to_string(starts[b]) + ", " + std::to_string(starts[b] + N) + ")";
    EXPECT_TRUE(matches_reference(got, want, want_lowp, dt)) << tag;
    EXPECT_LE(rel_err(got_lse, want_lse), 1e-4) << tag << ": lse";
  }
}

}  // namespace
}  // namespace flashkv::test
