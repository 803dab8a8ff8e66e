#include "gpu/decode_case.h"

#include <sstream>

#include "flashkv/reference.h"

namespace flashkv::test {

std::string DecodeCase::str() const {
  std::ostringstream os;
  os << dtype_name(dtype) << (is_fp8_dtype(fp8_kv) ? std::string(" kv ") + dtype_name(fp8_kv) : "")
     << scale.str() << " H" << num_qo_heads << "/" << num_kv_heads << " D" << head_dim << " page "
     << page_size << " " << kv_layout_name(layout) << (interleaved ? " interleaved" : "")
     << " batch " << kv_lens.size() << " lens [";
  for (size_t i = 0; i < kv_lens.size() && i < 8; ++i) os << (i ? "," : "") << kv_lens[i];
  if (kv_lens.size() > 8) os << ",...";
  os << "] fixed_split " << opts.fixed_split_size << (opts.disable_split_kv ? " nosplit" : "")
     << (opts.backend == DecodeBackend::kCudaCores     ? " cuda-cores"
         : opts.backend == DecodeBackend::kTensorCores ? " tensor-cores"
                                                       : " auto")
     << (ctas_per_sm ? " ctas_per_sm " + std::to_string(ctas_per_sm) : "")
     << (num_sms_to_use ? " num_sms_to_use " + std::to_string(num_sms_to_use) : "");
  return os.str();
}

namespace {
// Row r of a [batch, ...] tensor flattened to doubles: elements [r * n, (r + 1) * n).
std::vector<double> row_of(const std::vector<double>& t, int64_t r, int64_t n) {
  return std::vector<double>(t.begin() + r * n, t.begin() + (r + 1) * n);
}

// Lists the first failures (at most 5) of `count` requests; reason(i) is "" for a pass.
template <class Reason>
::testing::AssertionResult list_failures(size_t count, Reason&& reason) {
  int failed = 0;
  std::string first;
  for (size_t i = 0; i < count; ++i) {
    const std::string why = reason(i);
    if (why.empty()) continue;
    if (++failed <= 5) first += "\n  request " + std::to_string(i) + ": " + why;
  }
  if (failed == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failed << " of " << count << " requests fail on their own" << first;
}
}  // namespace

std::vector<ToleranceCheck> check_tolerance_per_request(const std::vector<double>& out,
                                                        const std::vector<double>& ref,
                                                        const std::vector<double>& ref_lowp,
                                                        int64_t batch, double floor) {
  std::vector<ToleranceCheck> checks;
  if (batch == 0) return checks;
  const int64_t n = static_cast<int64_t>(ref.size()) / batch;
  for (int64_t r = 0; r < batch; ++r) {
    checks.push_back(
        check_tolerance(row_of(out, r, n), row_of(ref, r, n), row_of(ref_lowp, r, n), floor));
  }
  return checks;
}

std::vector<double> rel_err_per_request(const std::vector<double>& got,
                                        const std::vector<double>& ref, int64_t batch) {
  std::vector<double> errs;
  if (batch == 0) return errs;
  const int64_t n = static_cast<int64_t>(ref.size()) / batch;
  for (int64_t r = 0; r < batch; ++r) errs.push_back(rel_err(row_of(got, r, n), row_of(ref, r, n)));
  return errs;
}

::testing::AssertionResult every_request_passes(const std::vector<ToleranceCheck>& checks) {
  return list_failures(checks.size(),
                       [&](size_t i) { return checks[i].pass ? std::string() : checks[i].str(); });
}

::testing::AssertionResult every_request_within(const std::vector<double>& errs, double bound) {
  return list_failures(errs.size(), [&](size_t i) {
    if (errs[i] <= bound) return std::string();  // (a NaN error fails)
    std::ostringstream os;
    os << "rel_err " << errs[i] << " > " << bound;
    return os.str();
  });
}

DecodeOutcome run_decode_case(const DecodeCase& c) {
  const int64_t B = static_cast<int64_t>(c.kv_lens.size());
  PagedCacheHost cache = make_paged_cache(c.kv_lens, c.page_size, c.num_kv_heads, c.head_dim,
                                          c.layout, c.kv_dtype(), c.seed, true, c.interleaved);
  set_kv_scale(cache, c.scale, c.seed);
  HostTensor q(c.dtype, {B, c.num_qo_heads, c.head_dim});
  q.fill_random(c.seed * 7 + 1);
  AttentionOptions ao;
  ao.sm_scale = c.opts.sm_scale;
  HostTensor ref(DType::f32, {B, c.num_qo_heads, c.head_dim}),
      ref_lowp(c.dtype, {B, c.num_qo_heads, c.head_dim});
  HostTensor ref_lse(DType::f32, {B, c.num_qo_heads});
  reference::batch_decode(q.view(), cache.cache, ref.view(), ref_lse.view(), ao);
  // The reference rounds once, at the end: rounding its f32 output to the dtype is what writing
  // it to a tensor of the dtype gives (up to ties after the f32 rounding), without a second run.
  for (int64_t i = 0; i < ref.numel(); ++i) ref_lowp.set(i, ref.get(i));

  DeviceCache dc = to_device(cache);
  DeviceTensor dq = to_device(q);
  DecodeOutcome o;
  o.out_host = HostTensor(c.dtype, {B, c.num_qo_heads, c.head_dim});
  HostTensor lse(DType::f32, {B, c.num_qo_heads});
  DeviceTensor dout = poisoned_like(o.out_host), dlse = poisoned_like(lse);

  BatchDecodeConfig cfg;
  cfg.max_batch = std::max<int>(1, static_cast<int>(B));
  cfg.num_qo_heads = c.num_qo_heads;
  cfg.head_dim = c.head_dim;
  cfg.ctas_per_sm = c.ctas_per_sm;
  cfg.num_sms_to_use = c.num_sms_to_use;
  cfg.max_kv_tokens = c.max_kv_tokens;
  cfg.min_fixed_split_size = c.min_fixed_split_size;
  DeviceBuffer ws(c.workspace_bytes > 0 ? c.workspace_bytes : BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  Stream s = create_stream();
  dec.plan({.kv_indptr = cache.indptr.view().data_as<int32_t>(),
            .kv_last_page_len = cache.last_page_len.view().data_as<int32_t>(),
            .batch_size = static_cast<int>(B),
            .page_size = c.page_size},
           {.num_qo_heads = c.num_qo_heads,
            .num_kv_heads = c.num_kv_heads,
            .head_dim = c.head_dim,
            .q_dtype = c.dtype,
            .kv_dtype = c.kv_dtype(),
            .o_dtype = c.dtype},
           c.opts, s);
  dec.run(dq.view, dc.cache, dout.view, dlse.view, s);
  synchronize(s);
  destroy_stream(s);
  o.plan = dec.plan_info();
  to_host(dout, o.out_host);
  to_host(dlse, lse);
  const auto out_d = o.out_host.to_doubles(), ref_d = ref.to_doubles(),
             ref_lowp_d = ref_lowp.to_doubles();
  o.out = check_tolerance(out_d, ref_d, ref_lowp_d, tolerance_floor(c.dtype));
  o.out_requests =
      check_tolerance_per_request(out_d, ref_d, ref_lowp_d, B, tolerance_floor(c.dtype));
  const auto lse_d = lse.to_doubles(), ref_lse_d = ref_lse.to_doubles();
  o.lse_nan = any_nan(lse_d);
  o.lse_err = rel_err(lse_d, ref_lse_d);
  o.lse_err_requests = rel_err_per_request(lse_d, ref_lse_d, B);
  return o;
}

void expect_decode_ok(const DecodeCase& c, const DecodeOutcome& o) {
  EXPECT_TRUE(o.out.pass) << c.str() << ": " << o.out.str();
  EXPECT_FALSE(o.lse_nan) << c.str();
  EXPECT_LE(o.lse_err, 1e-4) << c.str();
  EXPECT_TRUE(every_request_passes(o.out_requests)) << c.str() << " (out)";
  EXPECT_TRUE(every_request_within(o.lse_err_requests, 1e-4)) << c.str() << " (lse)";
}

}  // namespace flashkv::test
