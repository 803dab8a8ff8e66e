#include "ops/block_sparse/sparse_positions_variant.h"

#include <string>
#include <vector>

#include "flashkv/error.h"
#include "flashkv/variants.h"

namespace flashkv::ops {

bool needs_sparse_positions(const BlockSparseOptions& o) {
  return o.alibi_slopes.defined() || o.rope.mode != RopeMode::none;
}

std::vector<float> sparse_rope_freq_image(const RopeParams& rope, int head_dim) {
  const std::vector<double> f = rope_frequencies(rope, head_dim);
  std::vector<float> img(f.size() * 2);
  for (size_t i = 0; i < f.size(); ++i) {
    img[i] = static_cast<float>(f[i]);
    img[f.size() + i] = static_cast<float>(f[i] - static_cast<double>(img[i]));
  }
  return img;
}

Variant sparse_positions_variant(const SparsePositionsInputs& in) {
  check(!in.rope.q_rope_offset.defined() && !in.rope.k_rope_offset.defined(),
        "BlockSparseOptions.rope: the sparse ops rotate at the tokens' own positions; "
        "q_rope_offset / k_rope_offset are not taken");
  const bool alibi = in.alibi_slopes.defined(), rope = in.rope.mode != RopeMode::none;
  const bool cap = in.logits_soft_cap > 0.f, sinks = in.sinks.defined();
  const bool mask = in.custom_mask.defined();
  VariantSpec spec;
  spec.name = "SparsePositions";
  using K = VariantParam::Kind;
  spec.params = {{"ids", K::kTensor, DType::i32},
                 {"kv_ptr", K::kTensor, DType::i32},
                 {"q_start", K::kTensor, DType::i32},
                 {"page", K::kI32},
                 {"shift", K::kI32}};
  VariantArgs args;
  args.set("ids", in.ids).set("kv_ptr", in.kv_ptr).set("q_start", in.q_start);
  args.set("page", in.page).set("shift", static_cast<int32_t>(in.shift));
  // Each part switches its lines of the source on; the source is part of the JIT key, so every
  // combination compiles once.
  std::string src = R"(
struct SparsePositions {
  using Args = Params;
  // Keys past kv_len (a partial tile's padding, masked later) read the last key's entry: the
  // lookup stays inside the request's page ids.
  __device__ static long long key_pos(const Args& a, int batch, int j, int kv_len) {
    if (kv_len <= 0) return 0;
    j = j < kv_len ? j : kv_len - 1;
    const int page = a.ids[a.kv_ptr[batch] + j / a.page];
    return (long long)page * a.page + j % a.page;
  }
  __device__ static long long query_pos(const Args& a, int batch, int i) {
    return (long long)a.q_start[batch] + i + a.shift;
  }
)";
  if (alibi || cap) {
    src += R"(
  __device__ static float logits_transform(const Args& a, const flashkv::VariantPosition& p,
                                           float s) {
)";
    if (alibi) {
      spec.params.push_back({"slopes", K::kTensor, DType::f32});
      args.set("slopes", in.alibi_slopes);
      src += R"(    s += a.slopes[p.qo_head] *
         (float)(key_pos(a, p.batch, p.kv_idx, p.kv_len) - query_pos(a, p.batch, p.qo_idx));
)";
    }
    if (cap) {
      spec.params.push_back({"cap", K::kF32});
      spec.params.push_back({"inv_cap", K::kF32});
      args.set("cap", in.logits_soft_cap).set("inv_cap", 1.0f / in.logits_soft_cap);
      src += "    s = a.cap * (1.f - __fdividef(2.f, __expf(2.f * s * a.inv_cap) + 1.f));\n";
    }
    src += "    return s;\n  }\n";
  }
  if (mask) {
    spec.params.push_back({"mask", K::kTensor, DType::i32});  // the packed bytes
    spec.params.push_back({"mask_indptr", K::kTensor, DType::i32});
    const int64_t words = (in.custom_mask.num_bytes + 3) / 4;
    args.set("mask", TensorView(const_cast<uint8_t*>(in.custom_mask.bits), DType::i32,
                                {words > 0 ? words : 1}, in.ids.device()));
    args.set("mask_indptr", in.custom_mask.mask_indptr);
    src += R"(
  __device__ static bool logits_mask(const Args& a, const flashkv::VariantPosition& p) {
    const long long n = (long long)p.qo_idx * p.kv_len + p.kv_idx;
    const unsigned char* bytes = (const unsigned char*)a.mask + a.mask_indptr[p.batch];
    return (bytes[n >> 3] >> (n & 7)) & 1;
  }
)";
  }
  if (rope) {
    check(in.freq_hi_lo.defined() && in.freq_hi_lo.numel() == in.head_dim,
          "sparse_positions_variant: the RoPE frequencies need head_dim floats of scratch");
    const int64_t half = in.head_dim / 2;
    const int64_t shape[1] = {half}, strides[1] = {1};
    auto* lo = static_cast<float*>(in.freq_hi_lo.data()) + half;
    spec.params.push_back({"freq_hi", K::kTensor, DType::f32});
    spec.params.push_back({"freq_lo", K::kTensor, DType::f32});
    args.set("freq_hi",
             TensorView(in.freq_hi_lo.data(), DType::f32, 1, shape, strides, in.ids.device()));
    args.set("freq_lo", TensorView(lo, DType::f32, 1, shape, strides, in.ids.device()));
    src += R"(
  __device__ static void rotate(const Args& a, long long pos, int i, float& x1, float& x2) {
    float c, s;
    flashkv::rope_angle_cos_sin((double)a.freq_hi[i] + (double)a.freq_lo[i], pos, c, s);
    const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
    x1 = y1;
    x2 = y2;
  }
  __device__ static void query_transform(const Args& a, const flashkv::VariantRow& row, int i,
                                         float& x1, float& x2) {
    rotate(a, query_pos(a, row.batch, row.qo_idx), i, x1, x2);
  }
  __device__ static void key_transform(const Args& a, const flashkv::VariantKey& key, int i,
                                       float& x1, float& x2) {
    rotate(a, key_pos(a, key.batch, key.kv_idx, key.kv_len), i, x1, x2);
  }
)";
  }
  if (sinks) {
    spec.params.push_back({"sinks", K::kTensor, DType::f32});
    args.set("sinks", in.sinks);
    src += R"(
  __device__ static float sink(const Args& a, int qo_head) { return a.sinks[qo_head]; }
)";
  }
  src += "};\n";
  spec.source = std::move(src);
  return Variant::user(std::move(spec), std::move(args));
}

}  // namespace flashkv::ops
