// A user attention variant the library does not ship: a T5-style relative position bias,
// written as device C++ in a VariantSpec, JIT-compiled into batch decode (BatchDecode over a
// paged f16 cache, GQA 8/2, head_dim 128) and checked against a double-precision reference
// written here, independent of flashkv's own. Then a spec with a typo shows how a compile error
// in variant source is reported. Without a GPU only that part runs: NVRTC needs no GPU, and
// flashkv::precompile() compiles the variant into the decode kernel for sm_90a, as plan() would.
// Exit 0 on PASS, 1 on FAIL.
#include <flashkv/flashkv.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace flashkv;

namespace {

constexpr int kBatch = 3, kHq = 8, kHk = 2, kDim = 128, kPage = 16, kBuckets = 32;
constexpr int kKvLens[kBatch] = {1, 37, 300};

// The hook receives s = sm_scale * q·k (natural-log units) and returns the logit the softmax
// sees. Decode has one query per request, at q_pos() = kv_len - 1 (kernels/variants/variant.cuh).
// `Params` is generated from spec.params: { int num_buckets; const float* bias; }.
const char* kT5Source = R"(
struct T5Bias {
  using Args = Params;
  __device__ static float logits_transform(const Args& a, const flashkv::VariantPosition& p,
                                           float s) {
    const int bucket = min(max(p.q_pos() - p.kv_idx, 0), a.num_buckets - 1);
    return s + a.bias[bucket];
  }
};
)";

VariantSpec t5_spec(std::string name, std::string source) {
  VariantSpec s;
  s.name = std::move(name);
  s.source = std::move(source);
  s.params = {{"num_buckets", VariantParam::Kind::kI32},
              {"bias", VariantParam::Kind::kTensor, DType::f32}};
  return s;
}

// Host data in f16 bits; the reference reads the same rounded values the GPU reads.
std::vector<uint16_t> random_f16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_f16(u(rng));
  return v;
}

// A typo in the source (`bais`): compiling it throws flashkv::Error carrying NVRTC's log, whose
// positions are lines of spec.source, named "<Name>.variant(<line>)". `compile` compiles the
// variant (plan() on a GPU, precompile() without one). True when the error was reported so.
template <class Compile>
bool show_compile_error(Compile&& compile) {
  std::string typo = kT5Source;
  typo.replace(typo.find("a.bias["), 7, "a.bais[");
  const VariantSpec spec = t5_spec("T5Typo", typo);
  bool reported = false;
  try {
    compile(spec);
    std::printf("FAIL: the typo compiled\n");
  } catch (const Error& e) {
    std::istringstream lines(e.what());
    std::string line;
    std::printf("compile error, as reported:\n");
    for (int shown = 0; shown < 3 && std::getline(lines, line);) {
      if (line.find("T5Typo.variant(") == std::string::npos) continue;
      std::printf("  %s\n", line.c_str());
      reported = true;
      ++shown;
    }
    if (!reported) std::printf("FAIL: no error naming T5Typo.variant(<line>)\n");
  }
  return reported;
}

DeviceBuffer to_device(const void* p, size_t bytes) {
  DeviceBuffer b(bytes);
  b.copy_from_host(p, bytes);
  return b;
}

}  // namespace

int main() {
  if (!cuda_available()) {
    // plan() needs a device; precompile() runs NVRTC for a named architecture without one.
    std::printf("user_variant: no GPU (%s): no decode run; compiling the variant for sm_90a\n",
                cuda_unavailable_reason().c_str());
    const bool reported = show_compile_error([](const VariantSpec& spec) {
      PrecompileOptions o;
      o.arch = "sm_90a";
      o.ops = {"decode"};
      o.dtypes = {DType::f16};
      o.head_dims = {kDim};
      o.group_sizes = {kHq / kHk};
      o.page_sizes = {kPage};
      o.variants = {Variant::user(spec, VariantArgs())};
      precompile(o);
    });
    return reported ? 0 : 1;
  }
  std::mt19937 rng(7);
  // The paged cache: request b owns ceil(kv_len / kPage) pages, handed out in reverse order so
  // that the page table matters.
  std::vector<int32_t> indptr{0}, last_page_len, indices;
  for (int len : kKvLens) {
    const int pages = (len + kPage - 1) / kPage;
    indptr.push_back(indptr.back() + pages);
    last_page_len.push_back(len - (pages - 1) * kPage);
  }
  const int num_pages = indptr.back();
  for (int i = 0; i < num_pages; ++i) indices.push_back(num_pages - 1 - i);
  const size_t page_elems = size_t(kPage) * kHk * kDim;  // NHD page [kPage, kHk, kDim]
  std::vector<uint16_t> q = random_f16(size_t(kBatch) * kHq * kDim, rng);
  std::vector<uint16_t> k = random_f16(num_pages * page_elems, rng);
  std::vector<uint16_t> v = random_f16(num_pages * page_elems, rng);
  std::vector<float> bias(kBuckets);
  for (int i = 0; i < kBuckets; ++i) bias[i] = 0.5f * std::sin(0.7f * i) - 0.08f * i;

  DeviceBuffer dq = to_device(q.data(), q.size() * 2), dk = to_device(k.data(), k.size() * 2),
               dv = to_device(v.data(), v.size() * 2), dbias = to_device(bias.data(), kBuckets * 4),
               dind = to_device(indices.data(), indices.size() * 4),
               dptr = to_device(indptr.data(), indptr.size() * 4),
               dlast = to_device(last_page_len.data(), last_page_len.size() * 4),
               dout(q.size() * 2);
  const Device gpu = Device::cuda(0);
  PagedKVCache kv;
  kv.k = TensorView(dk.data(), DType::f16, {num_pages, kPage, kHk, kDim}, gpu);
  kv.v = TensorView(dv.data(), DType::f16, {num_pages, kPage, kHk, kDim}, gpu);
  kv.indptr = TensorView(dptr.data(), DType::i32, {kBatch + 1}, gpu);
  kv.indices = TensorView(dind.data(), DType::i32, {num_pages}, gpu);
  kv.last_page_len = TensorView(dlast.data(), DType::i32, {kBatch}, gpu);
  const TensorView qv(dq.data(), DType::f16, {kBatch, kHq, kDim}, gpu);
  const TensorView ov(dout.data(), DType::f16, {kBatch, kHq, kDim}, gpu);

  // The variant: its spec (compiled once per kernel configuration, cached on disk) and its
  // arguments (a device pointer captured by value at plan(); run() may replace them).
  const Variant t5 =
      Variant::user(t5_spec("T5Bias", kT5Source),
                    VariantArgs()
                        .set("num_buckets", kBuckets)
                        .set("bias", TensorView(dbias.data(), DType::f32, {kBuckets}, gpu)));
  const BatchDecodeConfig cfg{.max_batch = kBatch, .num_qo_heads = kHq, .head_dim = kDim};
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  // The batch (its host page table) and the heads (q, KV and out: f16, the default).
  const DecodeBatch batch{.kv_indptr = indptr.data(),
                          .kv_last_page_len = last_page_len.data(),
                          .batch_size = kBatch,
                          .page_size = kPage};
  const AttentionShape shape{.num_qo_heads = kHq, .num_kv_heads = kHk, .head_dim = kDim};
  dec.plan(batch, shape, DecodePlanOptions{.variant = t5});
  dec.run(qv, kv, ov, TensorView());  // no lse wanted
  synchronize();
  std::vector<uint16_t> out(q.size());
  dout.copy_to_host(out.data(), out.size() * 2);

  // Reference: softmax(sm_scale * q·k + bias[bucket]) · v in double, key j of request b at
  // page indices[indptr[b] + j / kPage], slot j % kPage; query head h reads KV head h / 4.
  const double scale = 1.0 / std::sqrt(double(kDim));
  double err2 = 0, ref2 = 0;
  for (int b = 0; b < kBatch; ++b) {
    const int len = kKvLens[b];
    for (int h = 0; h < kHq; ++h) {
      const uint16_t* qh = &q[(size_t(b) * kHq + h) * kDim];
      auto at = [&](const std::vector<uint16_t>& c, int j, int d) {
        const size_t page = indices[indptr[b] + j / kPage];
        return double(f16_to_float(
            c[page * page_elems + (size_t(j % kPage) * kHk + h / (kHq / kHk)) * kDim + d]));
      };
      std::vector<double> s(len);
      for (int j = 0; j < len; ++j) {
        double dot = 0;
        for (int d = 0; d < kDim; ++d) dot += double(f16_to_float(qh[d])) * at(k, j, d);
        s[j] = scale * dot + bias[std::clamp(len - 1 - j, 0, kBuckets - 1)];
      }
      const double m = *std::max_element(s.begin(), s.end());
      double denom = 0;
      for (double& x : s) denom += (x = std::exp(x - m));
      for (int d = 0; d < kDim; ++d) {
        double ref = 0;
        for (int j = 0; j < len; ++j) ref += s[j] * at(v, j, d);
        ref /= denom;
        const double got = f16_to_float(out[(size_t(b) * kHq + h) * kDim + d]);
        err2 += (got - ref) * (got - ref);
        ref2 += ref * ref;
      }
    }
  }
  // The repo's metric and cap (tests/common/test_util.h): ||out - ref|| / ||ref|| <= 1e-2.
  const double rel = std::sqrt(err2 / ref2);
  const bool pass = rel <= 1e-2;
  std::printf("user_variant: T5 bias decode, kv_lens 1/37/300, max relative error %.3g: %s\n", rel,
              pass ? "PASS" : "FAIL");

  // The typo, through plan() on the GPU.
  const bool reported = show_compile_error([&](const VariantSpec& spec) {
    dec.plan(batch, shape, DecodePlanOptions{.variant = Variant::user(spec, t5.args())});
  });
  return pass && reported ? 0 : 1;
}
