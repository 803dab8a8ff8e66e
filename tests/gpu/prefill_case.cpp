#include "gpu/prefill_case.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "flashkv/reference.h"

namespace flashkv::test {

void PrefillCase::set_requests(const PrefillRequests& reqs) {
  qo_lens.clear();
  kv_lens.clear();
  for (auto [qo, kv] : reqs) {
    qo_lens.push_back(qo);
    kv_lens.push_back(kv);
  }
}

void for_each_matrix_case(const PrefillRequests& reqs, int num_qo_heads,
                          std::span<const int> kv_heads, uint64_t seed0,
                          const std::function<void(const PrefillCase&)>& fn) {
  const int pages[] = {1, 5, 16, 64};
  int i = 0;
  uint64_t seed = seed0;
  for (DType dt : {DType::f16, DType::bf16}) {
    for (int d : {64, 128, 256}) {
      for (int hkv : kv_heads) {
        for (bool causal : {false, true}) {
          PrefillCase c;
          c.set_requests(reqs);
          c.num_qo_heads = num_qo_heads;
          c.num_kv_heads = hkv;
          c.head_dim = d;
          c.dtype = dt;
          // Storage rotates independently of causal (which alternates with i).
          c.page_size = pages[(i / 2) % 4];
          c.layout = (i / 8) % 2 ? KVLayout::HND : KVLayout::NHD;
          c.interleaved = (i / 2) % 3 == 0;
          c.opts.causal = causal;
          c.seed = seed++;
          ++i;
          fn(c);
        }
      }
    }
  }
}

int64_t PrefillCase::nnz_qo() const {
  int64_t n = 0;
  for (int64_t l : qo_lens) n += l;
  return n;
}

int64_t PrefillCase::nnz_kv() const {
  int64_t n = 0;
  for (int64_t l : kv_lens) n += l;
  return n;
}

std::string PrefillCase::str() const {
  std::ostringstream os;
  os << dtype_name(dtype) << (is_fp8_dtype(fp8_kv) ? std::string(" kv ") + dtype_name(fp8_kv) : "")
     << scale.str() << " H" << num_qo_heads << "/" << num_kv_heads << " D" << head_dim << " page "
     << page_size << " " << kv_layout_name(layout) << (interleaved ? " interleaved" : "")
     << (opts.causal ? " causal" : " non-causal") << " tile_rows " << opts.tile_rows
     << " fixed_split " << opts.fixed_split_size << (opts.disable_split_kv ? " nosplit" : "")
     << (opts.enable_cuda_graph ? " graph" : "") << (with_lse ? "" : " no-lse");
  if (opts.sm_scale > 0) os << " sm_scale " << opts.sm_scale;
  os << " seed " << seed << " batch " << qo_lens.size() << " (qo,kv) [";
  for (size_t i = 0; i < qo_lens.size() && i < 10; ++i) {
    os << (i ? "," : "") << "(" << qo_lens[i] << "," << (i < kv_lens.size() ? kv_lens[i] : -1)
       << ")";
  }
  if (qo_lens.size() > 10) os << ",...";
  os << "]";
  return os.str();
}

const char* prefill_kv_name(PrefillKV kv) { return kv == PrefillKV::kPaged ? "paged" : "ragged"; }

HostTensor rounded_to(const HostTensor& t, DType dtype) {
  HostTensor r(dtype, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) r.set(i, t.get(i));
  return r;
}

int64_t count_bad_empty_rows(const HostTensor& out, const HostTensor* lse,
                             const HostTensor& ref_lse, int64_t* empty) {
  const int64_t pairs = ref_lse.numel();  // rows x heads
  const int64_t dim = pairs > 0 ? out.numel() / pairs : 0;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  int64_t bad = 0, n_empty = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    if (ref_lse.get(p) != neg_inf) continue;
    ++n_empty;
    bool ok = lse == nullptr || lse->get(p) == neg_inf;
    for (int64_t d = 0; d < dim && ok; ++d) ok = out.get(p * dim + d) == 0.0;
    bad += ok ? 0 : 1;
  }
  if (empty != nullptr) *empty = n_empty;
  return bad;
}

HostTensor indptr_of(const std::vector<int64_t>& lens) {
  std::vector<int64_t> ptr{0};
  for (int64_t l : lens) ptr.push_back(ptr.back() + l);
  return make_i32(ptr);
}

BatchPrefillConfig prefill_config(int max_batch, int64_t max_qo_tokens, int num_qo_heads,
                                  int head_dim) {
  BatchPrefillConfig cfg;
  cfg.max_batch = max_batch;
  cfg.max_qo_tokens = max_qo_tokens;
  cfg.num_qo_heads = num_qo_heads;
  cfg.head_dim = head_dim;
  return cfg;
}

PrefillInputs make_prefill_inputs(const PrefillCase& c, const PrefillInputs* same_data) {
  if (c.qo_lens.size() != c.kv_lens.size()) {
    throw std::invalid_argument("PrefillCase: qo_lens and kv_lens differ in size");
  }
  PrefillInputs in;
  in.c = c;
  in.cache =
      make_paged_cache(c.kv_lens, c.page_size, c.num_kv_heads, c.head_dim, c.layout, c.kv_dtype(),
                       c.seed, /*shuffle_pages=*/true, c.interleaved, c.nan_padding);
  set_kv_scale(in.cache, c.scale, c.seed);
  in.qo_indptr = indptr_of(c.qo_lens);
  const int64_t nnz = c.nnz_qo();
  in.q = HostTensor(c.dtype, {nnz, c.num_qo_heads, c.head_dim});
  // A different stream from the KV's (make_paged_cache derives its own from c.seed).
  if (nnz > 0) in.q.fill_random(c.seed * 7919 + 17);

  if (same_data != nullptr) {
    const PrefillCase& o = same_data->c;
    if (o.qo_lens != c.qo_lens || o.kv_lens != c.kv_lens || o.num_qo_heads != c.num_qo_heads ||
        o.num_kv_heads != c.num_kv_heads || o.head_dim != c.head_dim || o.dtype != c.dtype ||
        o.fp8_kv != c.fp8_kv || o.opts.causal != c.opts.causal ||
        o.opts.sm_scale != c.opts.sm_scale || o.seed != c.seed) {
      throw std::invalid_argument("make_prefill_inputs: same_data is not the same logical data");
    }
    in.ref = same_data->ref;
    in.ref_lowp = same_data->ref_lowp;
    in.ref_lse = same_data->ref_lse;
  } else {
    in.ref = HostTensor(DType::f32, {nnz, c.num_qo_heads, c.head_dim});
    in.ref_lse = HostTensor(DType::f32, {nnz, c.num_qo_heads});
    AttentionOptions ao;
    ao.sm_scale = c.opts.sm_scale;
    ao.causal = c.opts.causal;
    reference::batch_prefill_paged(in.q.view(), in.qo_indptr.view(), in.cache.cache, in.ref.view(),
                                   in.ref_lse.view(), ao);
    in.ref_lowp = rounded_to(in.ref, c.dtype);
  }

  in.dcache = to_device(in.cache);
  in.dq = to_device(in.q);
  in.dk_ragged = to_device(in.cache.k_ragged);
  in.dv_ragged = to_device(in.cache.v_ragged);
  return in;
}

PrefillOutcome run_prefill(const PrefillInputs& in, PrefillKV kv,
                           const PrefillPlanOptions& opts_in) {
  const PrefillCase& c = in.c;
  EXPECT_EQ(opts_in.causal, c.opts.causal) << "run_prefill: the reference was computed otherwise";
  EXPECT_EQ(opts_in.sm_scale, c.opts.sm_scale) << "run_prefill: the reference used another scale";
  const int B = c.batch();
  const int64_t nnz = c.nnz_qo();
  const DType dt = c.dtype;

  PrefillOutcome o;
  o.out_host = HostTensor(dt, {nnz, c.num_qo_heads, c.head_dim});
  o.lse_host = HostTensor(DType::f32, {nnz, c.num_qo_heads});
  DeviceTensor dout = poisoned_like(o.out_host), dlse = poisoned_like(o.lse_host);
  const TensorView lse_view = c.with_lse ? dlse.view : TensorView();

  const BatchPrefillConfig cfg =
      prefill_config(std::max(1, B), std::max<int64_t>(1, nnz), c.num_qo_heads, c.head_dim);
  PrefillPlanOptions opts = opts_in;
  const int32_t* qo_indptr = in.qo_indptr.view().data_as<int32_t>();
  ScopedStream s;
  if (kv == PrefillKV::kPaged) {
    if (in.cache.cache.num_pages() > 0) {
      opts.kv_indices_host = in.cache.indices.view().data_as<int32_t>();
      opts.num_pages = in.cache.cache.num_pages();
    }
    DeviceBuffer ws(c.workspace_bytes > 0 ? c.workspace_bytes
                                          : BatchPrefillPaged::workspace_bytes(cfg));
    BatchPrefillPaged pf(cfg, ws.data(), ws.size());
    pf.plan({.qo_indptr = qo_indptr,
             .kv_indptr = in.cache.indptr.view().data_as<int32_t>(),
             .kv_last_page_len = in.cache.last_page_len.view().data_as<int32_t>(),
             .batch_size = B,
             .page_size = c.page_size},
            {.num_qo_heads = c.num_qo_heads,
             .num_kv_heads = c.num_kv_heads,
             .head_dim = c.head_dim,
             .q_dtype = dt,
             .kv_dtype = c.kv_dtype(),
             .o_dtype = dt},
            opts, s);
    pf.run(in.dq.view, in.dcache.cache, dout.view, lse_view, s);
    synchronize(s);
    o.plan = pf.plan_info();
  } else {
    DeviceBuffer ws(c.workspace_bytes > 0 ? c.workspace_bytes
                                          : BatchPrefillRagged::workspace_bytes(cfg));
    BatchPrefillRagged pf(cfg, ws.data(), ws.size());
    pf.plan({.qo_indptr = qo_indptr,
             .kv_indptr = in.cache.kv_indptr.view().data_as<int32_t>(),
             .kv_last_page_len = nullptr,
             .batch_size = B,
             .page_size = 0},
            {.num_qo_heads = c.num_qo_heads,
             .num_kv_heads = c.num_kv_heads,
             .head_dim = c.head_dim,
             .q_dtype = dt,
             .kv_dtype = c.kv_dtype(),
             .o_dtype = dt},
            opts, s);
    pf.run(in.dq.view, in.dk_ragged.view, in.dv_ragged.view, dout.view, lse_view,
           in.dcache.cache.scale, s);
    synchronize(s);
    o.plan = pf.plan_info();
  }
  to_host(dout, o.out_host);
  to_host(dlse, o.lse_host);

  const std::vector<double> out_d = o.out_host.to_doubles();
  o.out_nan = std::count_if(out_d.begin(), out_d.end(), [](double x) { return std::isnan(x); });
  o.out =
      check_tolerance(out_d, in.ref.to_doubles(), in.ref_lowp.to_doubles(), tolerance_floor(dt));
  if (c.with_lse) {
    const std::vector<double> lse_d = o.lse_host.to_doubles();
    o.lse_nan = any_nan(lse_d);
    o.lse_err = rel_err(lse_d, in.ref_lse.to_doubles());
  }
  o.bad_empty_rows = count_bad_empty_rows(o.out_host, c.with_lse ? &o.lse_host : nullptr,
                                          in.ref_lse, &o.empty_rows);
  return o;
}

PrefillOutcome run_prefill(const PrefillInputs& in, PrefillKV kv) {
  return run_prefill(in, kv, in.c.opts);
}

void expect_prefill_ok(const PrefillInputs& in, const PrefillOutcome& o, const std::string& what) {
  const std::string tag = in.c.str() + (what.empty() ? "" : " [" + what + "]");
  EXPECT_TRUE(o.out.pass) << tag << ": " << o.out.str() << "; " << o.out_nan
                          << " output elements left NaN";
  if (in.c.with_lse) {
    EXPECT_FALSE(o.lse_nan) << tag << ": lse has NaN (unwritten rows?)";
    EXPECT_LE(o.lse_err, 1e-4) << tag << ": lse";
  }
  EXPECT_EQ(o.bad_empty_rows, 0) << tag << ": of the " << o.empty_rows
                                 << " (row, head) pairs that see no key, these are not exactly "
                                    "out = 0, lse = -inf";
}

PrefillOutcome check_prefill_case(const PrefillCase& c) {
  const PrefillInputs in = make_prefill_inputs(c);
  PrefillOutcome o = run_prefill(in, PrefillKV::kPaged);
  expect_prefill_ok(in, o, "paged");
  return o;
}

}  // namespace flashkv::test
