#include "fuzz_inputs.h"

#include <algorithm>
#include <cmath>

#include "flashkv/error.h"
#include "flashkv/reference.h"

namespace flashkv::cli {

uint64_t derive_seed(uint64_t seed, uint64_t salt) {
  return SplitMix64(seed ^ (salt * 0xD1B54A32D192ED03ull)).next();
}

TensorView AttentionInputs::qo_indptr_view() const {
  return TensorView(const_cast<int32_t*>(qo_indptr.data()), DType::i32,
                    {static_cast<int64_t>(qo_indptr.size())});
}

void AttentionInputs::ragged_kv(HostTensor& k, HostTensor& v,
                                std::vector<int32_t>& kv_indptr) const {
  const RandomPagedCache& p = *cache;
  const int64_t B = static_cast<int64_t>(p.last.size());
  const int64_t H = p.host.num_kv_heads(), D = p.host.head_dim();
  kv_indptr = {0};
  for (int64_t b = 0; b < B; ++b)
    kv_indptr.push_back(static_cast<int32_t>(kv_indptr.back() + p.host.kv_len(b)));
  const int64_t n = kv_indptr.back();
  k = HostTensor(p.k.dtype(), {std::max<int64_t>(n, 1), H, D});
  v = HostTensor(p.k.dtype(), {std::max<int64_t>(n, 1), H, D});
  const size_t elem = dtype_size(p.k.dtype());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < kv_indptr[b + 1] - kv_indptr[b]; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const size_t dst = ((kv_indptr[b] + t) * H + h) * D * elem, src = p.offset(b, t, h) * elem;
        std::copy_n(static_cast<const std::byte*>(p.k.data()) + src, D * elem,
                    static_cast<std::byte*>(k.data()) + dst);
        std::copy_n(static_cast<const std::byte*>(p.v.data()) + src, D * elem,
                    static_cast<std::byte*>(v.data()) + dst);
      }
}

AttentionInputs make_attention_inputs(const FuzzConfig& c) {
  AttentionInputs in;
  const int Hq = c.num_qo_heads();
  in.cache = std::make_unique<RandomPagedCache>(c.kv_lens, c.page_size, c.num_kv_heads, c.head_dim,
                                                c.kv_dtype, derive_seed(c.seed, 1), c.layout);
  if (is_fp8_dtype(c.kv_dtype)) in.cache->host.scale = {.k = c.k_scale, .v = c.v_scale};
  // Rows per request: one (decode-like ops, a decode cascade) or qo_lens[i].
  const bool one_row = c.qo_lens.empty() || c.op == FuzzOp::kSparseDecode;
  std::vector<int64_t> qo(c.kv_lens.size(), 1);
  if (!one_row) qo = c.qo_lens;
  in.rows = {0};
  in.qo_indptr = {0};
  for (int64_t l : qo) {
    in.rows.push_back(in.rows.back() + l);
    in.qo_indptr.push_back(static_cast<int32_t>(in.rows.back()));
  }
  in.q = HostTensor(c.dtype, {std::max<int64_t>(in.rows.back(), 1), Hq, c.head_dim});
  in.q.fill_random(derive_seed(c.seed, 2));

  const FuzzVariant& fv = c.variant;
  AttentionVariant& v = in.variant;
  v.causal = c.causal;
  v.window_left = fv.window_left;
  v.logits_soft_cap = fv.soft_cap;
  v.sigmoid = fv.sigmoid;
  v.rope.mode = fv.rope;
  if (fv.alibi) {
    in.alibi = HostTensor(DType::f32, {Hq});
    for (int h = 0; h < Hq; ++h) in.alibi.set(h, std::ldexp(1.0, -(h % 8) - 1));
    v.alibi_slopes = in.alibi.view();
  }
  if (fv.sinks) {
    in.sinks = HostTensor(DType::f32, {Hq});
    in.sinks.fill_random(derive_seed(c.seed, 3), -1.0, 2.0);
    v.sinks = in.sinks.view();
  }
  if (fv.custom_mask) {
    std::vector<bool> bits;
    SplitMix64 rng(derive_seed(c.seed, 4));
    for (size_t b = 0; b < qo.size(); ++b)
      for (int64_t i = 0; i < qo[b] * c.kv_lens[b]; ++i) bits.push_back(rng.uniform() < 0.7);
    in.mask_bits = pack_custom_mask(bits, qo, c.kv_lens, in.mask_indptr);
    if (in.mask_bits.empty()) in.mask_bits.push_back(0);  // an address for all-empty requests
    v.custom_mask = {in.mask_bits.data(), static_cast<int64_t>(in.mask_bits.size()),
                     TensorView(in.mask_indptr.data(), DType::i32,
                                {static_cast<int64_t>(in.mask_indptr.size())})};
  }
  return in;
}

void attention_reference(const FuzzConfig& c, const AttentionInputs& in, const TensorView& out,
                         const TensorView& lse, const reference::KVChunk& chunk) {
  const TensorView q = in.q.view().slice0(0, in.rows.back());
  switch (c.op) {
    case FuzzOp::kDecode:
      reference::batch_decode_variant(q, in.cache->host, out, lse, in.variant, chunk);
      break;
    case FuzzOp::kPrefillPaged:
    case FuzzOp::kPrefillRagged:
      // Ragged KV is the same logical KV: the paged reference is its oracle too.
      reference::batch_prefill_paged_variant(q, in.qo_indptr_view(), in.cache->host, out, lse,
                                             in.variant, chunk);
      break;
    default:
      throw Error(std::string("attention_reference: not an attention op: ") + fuzz_op_name(c.op));
  }
}

AttentionVariant device_variant(const AttentionInputs& in, std::vector<DeviceBuffer>& keep) {
  AttentionVariant v = in.variant;
  if (v.alibi_slopes.defined()) v.alibi_slopes = to_gpu(in.alibi, keep);
  if (v.sinks.defined()) v.sinks = to_gpu(in.sinks, keep);
  if (v.custom_mask.defined()) {
    HostTensor bytes(DType::i32, {static_cast<int64_t>((in.mask_bits.size() + 3) / 4)});
    std::copy(in.mask_bits.begin(), in.mask_bits.end(), static_cast<uint8_t*>(bytes.data()));
    const TensorView bits = to_gpu(bytes, keep);
    HostTensor ip(DType::i32, {static_cast<int64_t>(in.mask_indptr.size())});
    std::copy(in.mask_indptr.begin(), in.mask_indptr.end(), static_cast<int32_t*>(ip.data()));
    v.custom_mask = {static_cast<const uint8_t*>(bits.data()), v.custom_mask.num_bytes,
                     to_gpu(ip, keep)};
  }
  return v;
}

}  // namespace flashkv::cli
