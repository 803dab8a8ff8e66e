#include "gpu/decode_case.h"

#include <sstream>

#include "flashkv/reference.h"

namespace flashkv::test {

std::string DecodeCase::str() const {
  std::ostringstream os;
  os << dtype_name(dtype) << " H" << num_qo_heads << "/" << num_kv_heads << " D" << head_dim
     << " page " << page_size << " " << kv_layout_name(layout)
     << (interleaved ? " interleaved" : "") << " batch " << kv_lens.size() << " lens [";
  for (size_t i = 0; i < kv_lens.size() && i < 8; ++i) os << (i ? "," : "") << kv_lens[i];
  if (kv_lens.size() > 8) os << ",...";
  os << "] fixed_split " << opts.fixed_split_size << (opts.disable_split_kv ? " nosplit" : "")
     << (opts.backend == DecodeBackend::kCudaCores     ? " cuda-cores"
         : opts.backend == DecodeBackend::kTensorCores ? " tensor-cores"
                                                       : " auto")
     << (ctas_per_sm ? " ctas_per_sm " + std::to_string(ctas_per_sm) : "");
  return os.str();
}

DecodeOutcome run_decode_case(const DecodeCase& c) {
  const int64_t B = static_cast<int64_t>(c.kv_lens.size());
  PagedCacheHost cache = make_paged_cache(c.kv_lens, c.page_size, c.num_kv_heads, c.head_dim,
                                          c.layout, c.dtype, c.seed, true, c.interleaved);
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
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  Stream s = create_stream();
  dec.plan(cache.indptr.view().data_as<int32_t>(), cache.last_page_len.view().data_as<int32_t>(),
           static_cast<int>(B), c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, c.dtype,
           c.dtype, c.dtype, c.opts, s);
  dec.run(dq.view, dc.cache, dout.view, dlse.view, s);
  synchronize(s);
  destroy_stream(s);
  o.plan = dec.plan_info();
  to_host(dout, o.out_host);
  to_host(dlse, lse);
  o.out = check_tolerance(o.out_host.to_doubles(), ref.to_doubles(), ref_lowp.to_doubles(),
                          tolerance_floor(c.dtype));
  const auto lse_d = lse.to_doubles();
  o.lse_nan = any_nan(lse_d);
  o.lse_err = rel_err(lse_d, ref_lse.to_doubles());
  return o;
}

void expect_decode_ok(const DecodeCase& c, const DecodeOutcome& o) {
  EXPECT_TRUE(o.out.pass) << c.str() << ": " << o.out.str();
  EXPECT_FALSE(o.lse_nan) << c.str();
  EXPECT_LE(o.lse_err, 1e-4) << c.str();
}

}  // namespace flashkv::test
