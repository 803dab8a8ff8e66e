// `flashkv fuzz` without a GPU: what can be checked on the host. For every configuration the
// plan checks (plan_checks.h, the GPU path's own) accept it and refuse a broken copy; for the
// planned ops the scheduler's promises hold on a random grid (scheduler/schedule_invariants.h);
// and the CPU reference agrees with a second path to the same answer: ⊕ of two KV chunks
// (decode, prefill), the cascade's levels (plain attention), a dense custom mask (block-sparse),
// a gather into ragged KV (sparse decode), element copies (append), pairwise merges (merge).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "flashkv/error.h"
#include "flashkv/plan_checks.h"
#include "flashkv/reference.h"
#include "flashkv/reference_block_sparse.h"
#include "flashkv/reference_cascade.h"
#include "flashkv/reference_kv_ops.h"
#include "fuzz_ops.h"
#include "scheduler/schedule_invariants.h"
#include "scheduler/split_bounds.h"

namespace flashkv::cli {
namespace {

// Two paths of the reference accumulate in double and write f32: they agree to f32 rounding.
constexpr double kSelfTolerance = 1e-5;

TensorView i32_view(const std::vector<int32_t>& v) {
  return TensorView(const_cast<int32_t*>(v.data()), DType::i32, {static_cast<int64_t>(v.size())});
}

template <class Fn>
bool throws(Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {
    return true;
  }
  return false;
}

int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), 0LL); }

// The plan checks accept c's batch and refuse a copy with one thing broken (which one follows
// the seed): a head count that does not divide, a head_dim no kernel has, page size 0, a last
// page longer than a page.
void check_plan_arguments(const FuzzConfig& c, const std::vector<int32_t>& qo_indptr,
                          const std::vector<int32_t>& kv_indptr, std::vector<int32_t> last,
                          bool paged, FuzzOutcome& o) {
  const int B = static_cast<int>(kv_indptr.size()) - 1;
  const bool prefill = !qo_indptr.empty();
  auto plan = [&](int hkv, int d, int page, const std::vector<int32_t>& lp) {
    if (prefill)
      check_prefill_plan(qo_indptr.data(), kv_indptr.data(), paged ? lp.data() : nullptr, B,
                         c.num_qo_heads(), hkv, d, page, paged, c.dtype, c.kv_dtype, c.dtype);
    else
      check_decode_plan(kv_indptr.data(), lp.data(), B, c.num_qo_heads(), hkv, d, page, c.dtype,
                        c.kv_dtype, c.dtype);
  };
  const int page = paged ? (prefill && c.op == FuzzOp::kPrefillRagged ? 0 : c.page_size) : 0;
  try {
    plan(c.num_kv_heads, c.head_dim, page, last);
  } catch (const Error& e) {
    return o.fail(std::string("plan checks refused a valid configuration: ") + e.what());
  }
  int which = static_cast<int>(derive_seed(c.seed, 11) % 4);
  if (which == 3 && !paged) which = 0;
  int hkv = c.num_kv_heads, d = c.head_dim, pg = page;
  if (which == 0) hkv = c.num_qo_heads() + 1;
  if (which == 1) d = 48;
  if (which == 2 && paged) pg = 0;
  if (which == 2 && !paged) d = 0;
  if (which == 3) {
    int b = 0;
    while (b < B && kv_indptr[b + 1] == kv_indptr[b]) ++b;
    if (b == B) {
      hkv = c.num_qo_heads() + 1;  // no request has pages: break the heads instead
    } else {
      last[b] = c.page_size + 1;
    }
  }
  if (!throws([&] { plan(hkv, d, pg, last); }))
    o.fail("plan checks accepted a broken configuration (mutation " + std::to_string(which) + ")");
}

// A random grid: 1..264 CTAs (an H100 runs 132 SMs x 2).
int draw_ctas(const FuzzConfig& c) { return 1 + static_cast<int>(derive_seed(c.seed, 12) % 264); }

void check_decode_schedule(const FuzzConfig& c, const std::vector<int64_t>& lens, FuzzOutcome& o) {
  scheduler::DecodeScheduleOptions so;
  so.num_ctas = draw_ctas(c);
  so.num_kv_heads = c.num_kv_heads;
  so.disable_split_kv = c.split == SplitMode::kDisabled;
  so.fixed_split_size = c.split == SplitMode::kFixed ? c.fixed_split_size : 0;
  so.balance_tail = c.balance_tail;  // BatchDecode's: off unless the plan asks
  const int B = std::max<int>(1, static_cast<int>(lens.size()));
  if (so.fixed_split_size > 0) {
    int64_t chunks = 0;
    for (int64_t l : lens)
      chunks += std::max<int64_t>(1, (l + so.fixed_split_size - 1) / so.fixed_split_size);
    so.max_slots = static_cast<int>(chunks * c.num_kv_heads);
    so.max_work_items = static_cast<int>(chunks * c.num_kv_heads) + so.num_ctas;
  } else {
    so.max_slots = scheduler::max_split_slots(so.num_ctas);
    so.max_work_items = scheduler::max_decode_work_items(B, c.num_kv_heads, so.num_ctas);
  }
  try {
    const scheduler::DecodeSchedule s = scheduler::plan_decode(lens, so);
    const std::string p = scheduler::decode_coverage_problem(lens, so, s);
    if (!p.empty()) o.fail("decode schedule (" + std::to_string(so.num_ctas) + " CTAs): " + p);
  } catch (const Error& e) {
    o.fail(std::string("decode schedule within its written bounds threw: ") + e.what());
  }
}

void check_prefill_schedule(const FuzzConfig& c, FuzzOutcome& o) {
  scheduler::PrefillScheduleOptions so;
  so.num_ctas = draw_ctas(c);
  so.num_kv_heads = c.num_kv_heads;
  so.group = c.group;
  so.causal = c.causal;
  so.disable_split_kv = c.split == SplitMode::kDisabled;
  so.fixed_split_size = c.split == SplitMode::kFixed ? c.fixed_split_size : 0;
  so.tile_rows = c.tile_rows;
  so.head_major = c.item_order == 2;
  const int tiles =
      scheduler::max_prefill_tiles(std::max(1, c.batch()), std::max<int64_t>(1, total(c.qo_lens)),
                                   c.num_kv_heads, c.group, c.tile_rows);
  if (so.fixed_split_size > 0) {
    int64_t chunks = 0;
    for (int64_t l : c.kv_lens) chunks += l / so.fixed_split_size + 1;
    so.max_slots = static_cast<int>(chunks * tiles);
    so.max_work_items = so.max_slots + tiles + so.num_ctas;
  } else {
    so.max_slots = scheduler::max_split_slots(so.num_ctas);
    so.max_work_items = scheduler::max_prefill_work_items(tiles, so.num_ctas);
  }
  try {
    const scheduler::PrefillSchedule s = scheduler::plan_prefill(c.qo_lens, c.kv_lens, so);
    const std::string p = scheduler::prefill_coverage_problem(c.qo_lens, c.kv_lens, so, s);
    if (!p.empty()) o.fail("prefill schedule (" + std::to_string(so.num_ctas) + " CTAs): " + p);
  } catch (const Error& e) {
    o.fail(std::string("prefill schedule within its written bounds threw: ") + e.what());
  }
}

// Decode and prefill: the whole against ⊕ of keys [0, s) and [s, end), the split point drawn
// from the seed (the sinks ride on the first chunk; sigmoid states add).
void check_split_identity(const FuzzConfig& c, FuzzOutcome& o) {
  const AttentionInputs in = make_attention_inputs(c);
  const int64_t rows = in.rows.back(), Hq = c.num_qo_heads(), D = c.head_dim;
  const bool softmax = !c.variant.sigmoid;
  HostTensor ref(DType::f32, {rows, Hq, D}), ref_lse(DType::f32, {rows, Hq});
  HostTensor a(DType::f32, {rows, Hq, D}), a_lse(DType::f32, {rows, Hq});
  HostTensor b(DType::f32, {rows, Hq, D}), b_lse(DType::f32, {rows, Hq});
  const int64_t max_kv = *std::max_element(c.kv_lens.begin(), c.kv_lens.end());
  const int64_t split = static_cast<int64_t>(derive_seed(c.seed, 13) % (max_kv + 1));
  auto lse_of = [&](HostTensor& t) { return softmax ? t.view() : TensorView(); };
  attention_reference(c, in, ref.view(), lse_of(ref_lse));
  attention_reference(c, in, a.view(), lse_of(a_lse), {.begin = 0, .end = split});
  attention_reference(c, in, b.view(), lse_of(b_lse),
                      {.begin = split, .end = -1, .with_sinks = false});
  HostTensor m(DType::f32, {rows, Hq, D}), m_lse(DType::f32, {rows, Hq});
  if (softmax) {
    reference::merge_state(a.view(), a_lse.view(), b.view(), b_lse.view(), m.view(), m_lse.view());
    o.check_close("lse: whole vs ⊕ of two chunks", m_lse, ref_lse, kSelfTolerance);
  } else {
    for (int64_t i = 0; i < m.numel(); ++i) m.set(i, a.get(i) + b.get(i));
  }
  o.check_close("out: whole vs ⊕ of two chunks (split at " + std::to_string(split) + ")", m, ref,
                kSelfTolerance);
}

// Sparse decode: decode over the selection's page table against ragged prefill (one row per
// request) over the selected tokens gathered into contiguous KV.
void check_sparse_decode(const FuzzConfig& c, FuzzOutcome& o) {
  const AttentionInputs in = make_attention_inputs(c);
  const SparseSelection sel = draw_token_selection(c, *in.cache);
  const int64_t B = c.batch(), Hq = c.num_qo_heads(), H = c.num_kv_heads, D = c.head_dim;
  HostTensor ref(DType::f32, {B, Hq, D}), ref_lse(DType::f32, {B, Hq});
  reference::batch_decode(in.q.view(), sel.host, ref.view(), ref_lse.view());
  const int64_t n = static_cast<int64_t>(sel.ids.size());
  HostTensor kr(c.kv_dtype, {std::max<int64_t>(n, 1), H, D}),
      vr(c.kv_dtype, {std::max<int64_t>(n, 1), H, D});
  const size_t row = static_cast<size_t>(H * D) * dtype_size(c.kv_dtype);
  for (int64_t t = 0; t < n; ++t) {
    // token_pages: view page id = page * page_size + slot, NHD rows of H * D elements.
    std::copy_n(static_cast<const std::byte*>(in.cache->k.data()) + sel.ids[t] * row, row,
                static_cast<std::byte*>(kr.data()) + t * row);
    std::copy_n(static_cast<const std::byte*>(in.cache->v.data()) + sel.ids[t] * row, row,
                static_cast<std::byte*>(vr.data()) + t * row);
  }
  std::vector<int32_t> qo_ptr{0};
  for (int64_t b = 0; b < B; ++b) qo_ptr.push_back(static_cast<int32_t>(b + 1));
  HostTensor got(DType::f32, {B, Hq, D}), got_lse(DType::f32, {B, Hq});
  AttentionOptions ao;
  ao.kv_scale = in.cache->host.scale;
  reference::batch_prefill_ragged(in.q.view(), i32_view(qo_ptr), kr.view().slice0(0, n),
                                  vr.view().slice0(0, n), i32_view(sel.indptr), got.view(),
                                  got_lse.view(), ao);
  o.check_close("out: token selection vs gathered ragged KV", got, ref, kSelfTolerance);
  o.check_close("lse: token selection vs gathered ragged KV", got_lse, ref_lse, kSelfTolerance);
}

// The step on the reference: the new value lands at kv_len - 1 (quantized like any append), and
// the output is finite.
void check_decode_step(const FuzzConfig& c, FuzzOutcome& o) {
  AttentionInputs in = make_attention_inputs(c);
  const StepInputs st = make_step_inputs(c, in);
  const int64_t B = c.batch(), Hq = c.num_qo_heads(), H = c.num_kv_heads, D = c.head_dim;
  HostTensor out(DType::f32, {B, Hq, D}), lse(DType::f32, {B, Hq});
  step_reference(c, st, in, out.view(), lse.view());
  if (any_nan(out.to_doubles()) || any_nan(lse.to_doubles()))
    o.fail("the step's reference output has NaN");
  HostTensor want(c.kv_dtype, {1});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t at = in.cache->offset(b, in.cache->host.kv_len(static_cast<int>(b)) - 1, h);
      for (int64_t d = 0; d < D; ++d) {
        const float x = static_cast<float>(st.new_v.get((b * H + h) * D + d));
        want.set(0, is_fp8_dtype(c.kv_dtype) ? x / c.v_scale : x);
        if (in.cache->v.get(at + d) != want.get(0))
          return o.fail("the step's new value is not at kv_len - 1 (request " + std::to_string(b) +
                        ")");
      }
    }
}

// The append: the reference against writing each row into its slot directly.
void check_append(const FuzzConfig& c, FuzzOutcome& o) {
  AppendInputs ref = make_append_inputs(c);
  AppendInputs direct = make_append_inputs(c);
  reference::append_paged_kv_cache(ref.new_k.view(), ref.new_v.view(), ref.batch_indices.view(),
                                   ref.positions.view(), ref.cache->host);
  const int64_t H = c.num_kv_heads, D = c.head_dim;
  HostTensor one(c.kv_dtype, {1});
  for (int64_t t = 0; t < direct.batch_indices.numel(); ++t) {
    const auto b = static_cast<int64_t>(direct.batch_indices.get(t));
    const auto p = static_cast<int64_t>(direct.positions.get(t));
    for (int64_t h = 0; h < H; ++h) {
      const int64_t at = direct.cache->offset(b, p, h);
      for (int64_t d = 0; d < D; ++d) {
        const float kx = static_cast<float>(direct.new_k.get((t * H + h) * D + d));
        const float vx = static_cast<float>(direct.new_v.get((t * H + h) * D + d));
        const bool fp8 = is_fp8_dtype(c.kv_dtype);
        one.set(0, fp8 ? kx / c.k_scale : kx);
        direct.cache->k.set(at + d, one.get(0));
        one.set(0, fp8 ? vx / c.v_scale : vx);
        direct.cache->v.set(at + d, one.get(0));
      }
    }
  }
  o.check_bitwise("cache k: reference append vs direct writes", ref.cache->k, direct.cache->k);
  o.check_bitwise("cache v: reference append vs direct writes", ref.cache->v, direct.cache->v);
}

// The cascade: the reference's levels (shared prefixes, then the suffixes) against plain
// attention over the composed page table, and the plan checks.
void check_cascade(const FuzzConfig& c, FuzzOutcome& o) {
  const CascadeInputs ci = make_cascade_inputs(c);
  CascadeShape shape{.num_qo_heads = c.num_qo_heads(),
                     .num_kv_heads = c.num_kv_heads,
                     .head_dim = c.head_dim,
                     .dtype = c.dtype,
                     .kv_dtype = is_fp8_dtype(c.kv_dtype) ? c.kv_dtype : DType::f32};
  try {
    check_cascade_plan({.qo_indptr = c.qo_lens.empty() ? nullptr : ci.qo_indptr.data(),
                        .kv_indptr = ci.indptr.data(),
                        .kv_indices = ci.ids.data(),
                        .kv_last_page_len = ci.last.data(),
                        .batch_size = c.batch(),
                        .page_size = c.page_size},
                       shape);
  } catch (const Error& e) {
    return o.fail(std::string("cascade plan checks refused a valid batch: ") + e.what());
  }
  const int64_t rows = ci.rows.back(), Hq = c.num_qo_heads(), D = c.head_dim;
  HostTensor ref(DType::f32, {rows, Hq, D}), ref_lse(DType::f32, {rows, Hq});
  cascade_plain_reference(c, ci, ref.view(), ref_lse.view());
  // Level 0: one group per share_group requests over its prefix pages; level 1: each request's
  // own pages.
  const RandomPagedCache& st = *ci.storage;
  const int groups = c.batch() / c.share_group;
  std::vector<int32_t> q0{0}, kv0{0}, ids0, last0, q1{0}, kv1{0}, ids1, last1;
  for (int g = 0; g < groups; ++g) {
    q0.push_back(ci.qo_indptr[(g + 1) * c.share_group]);
    for (int32_t p = st.indptr[g]; p < st.indptr[g + 1]; ++p) ids0.push_back(st.idx[p]);
    kv0.push_back(static_cast<int32_t>(ids0.size()));
    last0.push_back(c.shared_pages > 0 ? c.page_size : 0);
  }
  for (int i = 0; i < c.batch(); ++i) {
    q1.push_back(ci.qo_indptr[i + 1]);
    for (int32_t p = st.indptr[groups + i]; p < st.indptr[groups + i + 1]; ++p)
      ids1.push_back(st.idx[p]);
    kv1.push_back(static_cast<int32_t>(ids1.size()));
    last1.push_back(st.last[groups + i]);
  }
  const reference::CascadeLevelView levels[] = {
      {i32_view(q0), i32_view(kv0), i32_view(ids0), i32_view(last0)},
      {i32_view(q1), i32_view(kv1), i32_view(ids1), i32_view(last1)}};
  AttentionOptions ao;
  ao.causal = c.causal && !c.qo_lens.empty();
  ao.kv_scale = ci.host.scale;
  HostTensor got(DType::f32, {rows, Hq, D}), got_lse(DType::f32, {rows, Hq});
  reference::multi_level_cascade(ci.q.view(), st.host.k, st.host.v, c.layout, levels, got.view(),
                                 got_lse.view(), ao);
  o.check_close("out: cascade levels vs plain attention", got, ref, kSelfTolerance);
  o.check_close("lse: cascade levels vs plain attention", got_lse, ref_lse, kSelfTolerance);
}

// Dense masked attention of q rows [M] over one page of N keys (the block-sparse references'
// second path): `mask` [M, N] bytes, with the options' soft-cap, sinks, ALiBi and RoPE.
void dense_reference(const FuzzConfig& c, const HostTensor& q, const HostTensor& k,
                     const HostTensor& v, const std::vector<uint8_t>& mask, const HostTensor& sinks,
                     const HostTensor& alibi, const TensorView& out, const TensorView& lse) {
  const int64_t M = q.shape()[0], N = k.shape()[0], H = k.shape()[1], D = k.shape()[2];
  std::vector<bool> bits(mask.begin(), mask.end());
  std::vector<int32_t> mask_indptr;
  std::vector<uint8_t> packed = pack_custom_mask(bits, {M}, {N}, mask_indptr);
  if (packed.empty()) packed.push_back(0);
  std::vector<int32_t> qo{0, static_cast<int32_t>(M)}, ip{0, 1}, idx{0},
      last{static_cast<int32_t>(N)};
  PagedKVCache pc;
  pc.k = TensorView(const_cast<void*>(k.data()), k.dtype(), {1, N, H, D});
  pc.v = TensorView(const_cast<void*>(v.data()), v.dtype(), {1, N, H, D});
  pc.indptr = i32_view(ip);
  pc.indices = i32_view(idx);
  pc.last_page_len = i32_view(last);
  if (is_fp8_dtype(c.kv_dtype)) pc.scale = {.k = c.k_scale, .v = c.v_scale};
  AttentionVariant av;
  av.logits_soft_cap = c.variant.soft_cap;
  if (c.variant.sinks) av.sinks = sinks.view();
  if (c.variant.alibi) av.alibi_slopes = alibi.view();
  av.rope.mode = c.variant.rope;
  av.custom_mask = {packed.data(), static_cast<int64_t>(packed.size()), i32_view(mask_indptr)};
  reference::batch_prefill_paged_variant(q.view(), i32_view(qo), pc, out, lse, av);
}

void check_block_sparse(const FuzzConfig& c, FuzzOutcome& o) {
  const SparseInputs si = make_sparse_inputs(c);
  const int64_t M = c.qo_lens[0], N = c.kv_lens[0], Hq = c.num_qo_heads(), D = c.head_dim;
  const int64_t g = c.group;
  HostTensor ref(DType::f32, {M, Hq, D}), ref_lse(DType::f32, {M, Hq});
  HostTensor got(DType::f32, {M, Hq, D}), got_lse(DType::f32, {M, Hq});
  const BlockSparseOptions opts = si.options(nullptr);
  auto causal_ok = [&](int64_t m, int64_t n) { return !c.causal || n <= m + N - M; };
  if (c.op == FuzzOp::kBlockSparse) {
    const BlockSparseLayout l = si.bsr_layout();
    try {
      check_block_sparse_layout(l);
    } catch (const Error& e) {
      return o.fail(std::string("a drawn layout was refused: ") + e.what());
    }
    reference::block_sparse_attention(si.q.view(), si.k.view(), si.v.view(), l, ref.view(),
                                      ref_lse.view(), opts);
    std::vector<uint8_t> mask(M * N, 0);
    for (int64_t i = 0; i < M / c.block_r; ++i)
      for (int32_t t = si.indptr[i]; t < si.indptr[i + 1]; ++t)
        for (int64_t r = 0; r < c.block_r; ++r)
          for (int64_t cc = 0; cc < c.block_c; ++cc) {
            const int64_t m = i * c.block_r + r, n = si.indices[t] * c.block_c + cc;
            const bool elem =
                !c.element_mask || si.block_mask[(t * c.block_r + r) * c.block_c + cc] != 0;
            mask[m * N + n] = elem && causal_ok(m, n);
          }
    dense_reference(c, si.q, si.k, si.v, mask, si.sinks, si.alibi, got.view(), got_lse.view());
  } else {
    const VariableBlockSparseLayout l = si.variable_layout();
    try {
      check_variable_block_sparse_layout(l);
    } catch (const Error& e) {
      return o.fail(std::string("a drawn layout was refused: ") + e.what());
    }
    reference::variable_block_sparse_attention(si.q.view(), si.k.view(), si.v.view(), l, ref.view(),
                                               ref_lse.view(), opts);
    // Per KV head: its query heads and its keys alone, under that head's dense mask.
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      std::vector<uint8_t> mask(M * N, 0);
      int64_t row0 = 0;
      for (int64_t a = 0; a < l.MB; ++a) {
        const int64_t rs = si.row_sz[h * l.MB + a];
        int64_t col0 = 0;
        for (int64_t b = 0; b < l.NB; ++b) {
          const int64_t cs = si.col_sz[h * l.NB + b];
          if (si.mask_map[(h * l.MB + a) * l.NB + b])
            for (int64_t m = row0; m < row0 + rs; ++m)
              for (int64_t n = col0; n < col0 + cs; ++n) mask[m * N + n] = causal_ok(m, n);
          col0 += cs;
        }
        row0 += rs;
      }
      HostTensor qh(c.dtype, {M, g, D}), kh(c.kv_dtype, {N, 1, D}), vh(c.kv_dtype, {N, 1, D});
      HostTensor sh(DType::f32, {g}), ah(DType::f32, {g});
      for (int64_t m = 0; m < M; ++m)
        for (int64_t e = 0; e < g * D; ++e)
          qh.set(m * g * D + e, si.q.get((m * Hq + h * g) * D + e));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t e = 0; e < D; ++e) {
          kh.set(n * D + e, si.k.get((n * c.num_kv_heads + h) * D + e));
          vh.set(n * D + e, si.v.get((n * c.num_kv_heads + h) * D + e));
        }
      for (int64_t j = 0; j < g; ++j) {
        sh.set(j, si.sinks.get(h * g + j));
        ah.set(j, si.alibi.get(h * g + j));
      }
      HostTensor oh(DType::f32, {M, g, D}), lh(DType::f32, {M, g});
      dense_reference(c, qh, kh, vh, mask, sh, ah, oh.view(), lh.view());
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < g; ++j) {
          got_lse.set(m * Hq + h * g + j, lh.get(m * g + j));
          for (int64_t e = 0; e < D; ++e)
            got.set((m * Hq + h * g + j) * D + e, oh.get((m * g + j) * D + e));
        }
    }
  }
  o.check_close("out: block-sparse reference vs dense masked attention", got, ref, kSelfTolerance);
  o.check_close("lse: block-sparse reference vs dense masked attention", got_lse, ref_lse,
                kSelfTolerance);
}

void check_merge(const FuzzConfig& c, FuzzOutcome& o) {
  const MergeInputs mi = make_merge_inputs(c);
  const int64_t n = c.qo_lens[0], S = c.kv_lens[0], H = c.num_kv_heads, D = c.head_dim;
  HostTensor ref(DType::f32, {n, H, D}), ref_s(DType::f32, {n, H});
  reference::merge_states(mi.v.view(), mi.s.view(), ref.view(), ref_s.view());
  // ⊕ is associative: folding the S states pairwise with merge_state equals merge_states.
  HostTensor acc(DType::f32, {n, H, D}), acc_s(DType::f32, {n, H}), part(DType::f32, {n, H, D}),
      part_s(DType::f32, {n, H});
  acc.fill(0);
  acc_s.fill(-std::numeric_limits<double>::infinity());
  for (int64_t k = 0; k < S; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < H * D; ++j)
        part.set(i * H * D + j, mi.v.get((i * S + k) * H * D + j));
      for (int64_t j = 0; j < H; ++j) part_s.set(i * H + j, mi.s.get((i * S + k) * H + j));
    }
    reference::merge_state(acc.view(), acc_s.view(), part.view(), part_s.view(), acc.view(),
                           acc_s.view());
  }
  o.check_close("v: merge_states vs a fold of merge_state", acc, ref, kSelfTolerance);
  o.check_close("s: merge_states vs a fold of merge_state", acc_s, ref_s, kSelfTolerance);
}

}  // namespace

FuzzOutcome run_on_cpu(const FuzzConfig& c) {
  FuzzOutcome o;
  switch (c.op) {
    case FuzzOp::kDecode:
    case FuzzOp::kDecodeStep: {
      const RandomPagedCache cache(c.kv_lens, c.page_size, c.num_kv_heads, c.head_dim, c.kv_dtype,
                                   derive_seed(c.seed, 1), c.layout);
      check_plan_arguments(c, {}, cache.indptr, cache.last, true, o);
      check_decode_schedule(c, c.kv_lens, o);
      if (c.op == FuzzOp::kDecode)
        check_split_identity(c, o);
      else
        check_decode_step(c, o);
      break;
    }
    case FuzzOp::kSparseDecode: {
      check_decode_schedule(c, c.qo_lens, o);
      check_sparse_decode(c, o);
      break;
    }
    case FuzzOp::kPrefillPaged:
    case FuzzOp::kPrefillRagged: {
      const AttentionInputs in = make_attention_inputs(c);
      if (c.op == FuzzOp::kPrefillPaged) {
        check_plan_arguments(c, in.qo_indptr, in.cache->indptr, in.cache->last, true, o);
      } else {
        HostTensor k, v;
        std::vector<int32_t> kv_indptr;
        in.ragged_kv(k, v, kv_indptr);
        check_plan_arguments(c, in.qo_indptr, kv_indptr, {}, false, o);
      }
      check_prefill_schedule(c, o);
      check_split_identity(c, o);
      break;
    }
    case FuzzOp::kAppend:
      check_append(c, o);
      break;
    case FuzzOp::kCascade:
      check_cascade(c, o);
      break;
    case FuzzOp::kBlockSparse:
    case FuzzOp::kVariableBlockSparse:
      check_block_sparse(c, o);
      break;
    case FuzzOp::kMerge:
      check_merge(c, o);
      break;
  }
  return o;
}

}  // namespace flashkv::cli
