#include "fuzz_config.h"

#include <algorithm>
#include <initializer_list>
#include <numeric>
#include <sstream>

#include "cli_checks.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"

namespace flashkv::cli {
namespace {

struct OpName {
  FuzzOp op;
  const char* name;
};
constexpr OpName kOpNames[] = {{FuzzOp::kDecode, "decode"},
                               {FuzzOp::kDecodeStep, "decode_step"},
                               {FuzzOp::kSparseDecode, "sparse_decode"},
                               {FuzzOp::kPrefillPaged, "prefill_paged"},
                               {FuzzOp::kPrefillRagged, "prefill_ragged"},
                               {FuzzOp::kAppend, "append"},
                               {FuzzOp::kCascade, "cascade"},
                               {FuzzOp::kBlockSparse, "block_sparse"},
                               {FuzzOp::kVariableBlockSparse, "variable_block_sparse"},
                               {FuzzOp::kMerge, "merge"}};

// The value pools. Page sizes and GQA groups are in the decode kernel's key (one instantiation
// per value; docs/design.md "Kernel keys"), so a few values that cover the range (1, an odd size,
// the common 16, the largest 128) keep a 10 000-configuration run to a few hundred kernels, which
// scripts precompile in parallel (.carry run.sh) instead of one NVRTC compile per new value.
constexpr int kHeadDims[] = {64, 128, 128, 256};
constexpr int kGroups[] = {1, 4, 7, 8, 16};
constexpr int kKVHeads[] = {1, 2, 4};
constexpr int kPageSizes[] = {1, 3, 16, 64, 128};
constexpr int kFixedSplits[] = {16, 37, 64, 256};
constexpr float kScales[] = {1.0f, 0.5f, 2.0f, 0.25f};
constexpr int kBlockR[] = {1, 2, 3, 4, 8, 16, 64};
constexpr int kBlockC[] = {1, 2, 3, 8, 16, 32};
constexpr int kDensity[] = {10, 30, 60, 100};

// The CPU reference's cost of a configuration, in multiply-adds (q·k and p·v per visible key):
// configurations above the budget are shrunk (longest request halved) until they fit. GPU
// runs: 2^25 (about 5 ms of the reference on 16 cores); CPU-only runs compute the reference
// twice on 2 cores, for 2 000 configurations in well under a minute: 2^17.
constexpr int64_t kGpuBudget = int64_t{1} << 25;
constexpr int64_t kCpuBudget = int64_t{1} << 17;

class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed ^ 0x5EEDF00DCAFEull) {}
  uint64_t below(uint64_t n) { return rng_.next() % n; }
  int64_t range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(below(hi - lo + 1)); }
  bool chance(double p) { return rng_.uniform() < p; }
  template <class T, size_t N>
  T pick(const T (&a)[N]) {
    return a[below(N)];
  }
  template <class T>
  T pick(std::initializer_list<T> a) {
    return *(a.begin() + below(a.size()));
  }

 private:
  SplitMix64 rng_;
};

bool takes_fp8(FuzzOp op) { return op != FuzzOp::kMerge; }
bool takes_variant(FuzzOp op) {
  return op == FuzzOp::kDecode || op == FuzzOp::kPrefillPaged || op == FuzzOp::kPrefillRagged;
}
bool takes_graph(FuzzOp op) {
  return op == FuzzOp::kDecode || op == FuzzOp::kDecodeStep || op == FuzzOp::kSparseDecode ||
         op == FuzzOp::kPrefillPaged || op == FuzzOp::kPrefillRagged || op == FuzzOp::kCascade;
}
bool takes_split(FuzzOp op) {
  return op == FuzzOp::kDecode || op == FuzzOp::kDecodeStep || op == FuzzOp::kSparseDecode ||
         op == FuzzOp::kPrefillPaged || op == FuzzOp::kPrefillRagged;
}
bool is_decode_like(FuzzOp op) {
  return op == FuzzOp::kDecode || op == FuzzOp::kDecodeStep || op == FuzzOp::kSparseDecode;
}
bool is_prefill(FuzzOp op) { return op == FuzzOp::kPrefillPaged || op == FuzzOp::kPrefillRagged; }

// A request length: empty and length-1 requests often, an occasional long one.
int64_t draw_len(Draw& d, int64_t typical, int64_t long_len) {
  const uint64_t k = d.below(20);
  if (k < 2) return 0;
  if (k < 4) return 1;
  if (k < 5) return d.range(long_len / 2, long_len);
  return d.range(2, typical);
}

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), 0LL); }

int64_t reference_cost(const FuzzConfig& c) {
  const int64_t hd = int64_t{c.num_qo_heads()} * c.head_dim;
  switch (c.op) {
    case FuzzOp::kDecode:
    case FuzzOp::kDecodeStep:
      return sum(c.kv_lens) * hd;
    case FuzzOp::kSparseDecode:
      return (sum(c.kv_lens) + sum(c.qo_lens)) * hd;
    case FuzzOp::kAppend:
      return (sum(c.kv_lens) + sum(c.qo_lens)) * c.num_kv_heads * c.head_dim;
    case FuzzOp::kMerge:
      return c.qo_lens[0] * c.kv_lens[0] * hd;
    case FuzzOp::kCascade: {
      int64_t t = 0;
      const int64_t prefix = int64_t{c.shared_pages} * c.page_size;
      for (int i = 0; i < c.batch(); ++i)
        t += std::max<int64_t>(1, c.qo_lens.empty() ? 1 : c.qo_lens[i]) * (c.kv_lens[i] + prefix);
      return t * hd;
    }
    default: {
      int64_t t = 0;
      for (size_t i = 0; i < c.kv_lens.size(); ++i) t += c.qo_lens[i] * c.kv_lens[i];
      return t * hd;
    }
  }
}

// Halves the longest of `lens` (keeping 2 as the floor of what was longer) until `c` fits.
void shrink_to_budget(FuzzConfig& c, int64_t budget) {
  for (int guard = 0; guard < 64 && reference_cost(c) > budget; ++guard) {
    std::vector<int64_t>* lists[] = {&c.kv_lens, &c.qo_lens};
    std::vector<int64_t>* best = nullptr;
    size_t at = 0;
    for (auto* l : lists)
      for (size_t i = 0; i < l->size(); ++i)
        if (!best || (*l)[i] > (*best)[at]) best = l, at = i;
    if (!best || (*best)[at] <= 2) break;
    (*best)[at] = std::max<int64_t>(2, (*best)[at] / 2);
  }
}

void draw_variant(Draw& d, FuzzConfig& c, int64_t max_kv) {
  FuzzVariant& v = c.variant;
  if (d.chance(0.12)) {  // sigmoid attention: no softmax, no sinks, no lse
    v.sigmoid = true;
    if (d.chance(0.4)) v.window_left = static_cast<int>(d.range(0, max_kv));
    return;
  }
  const int features = d.chance(0.6) ? 1 : 2;
  for (int i = 0; i < features; ++i) {
    switch (d.below(6)) {
      case 0:
        v.window_left = static_cast<int>(d.range(0, std::max<int64_t>(1, max_kv)));
        break;
      case 1:
        v.soft_cap = d.pick({5.0f, 30.0f});
        break;
      case 2:
        v.alibi = true;
        break;
      case 3:
        v.sinks = true;
        break;
      case 4:
        v.custom_mask = true;
        break;
      default:
        v.rope = d.pick({RopeMode::llama, RopeMode::llama31});
        break;
    }
  }
}

// Prefill's partial-state slots are 2 per CTA (prefill.h): a fixed split that cuts more chunks
// than a small GPU has slots for is refused by plan(). Keep the forced split where it fits 132
// SMs x 1 CTA (the smallest grid head_dim 256 gets) with room to spare.
bool prefill_fixed_split_fits(const FuzzConfig& c) {
  int64_t chunks = 0;
  for (size_t i = 0; i < c.kv_lens.size(); ++i) {
    const int64_t tiles = (c.qo_lens[i] * c.group + 15) / 16;
    chunks +=
        tiles * c.num_kv_heads * ((c.kv_lens[i] + c.fixed_split_size - 1) / c.fixed_split_size);
  }
  return chunks <= 200;
}

}  // namespace

uint64_t fuzz_family(uint64_t seed) { return seed >> kFuzzFamilyBits; }

const char* fuzz_op_name(FuzzOp op) {
  for (const auto& o : kOpNames)
    if (o.op == op) return o.name;
  return "?";
}

std::vector<std::string> fuzz_op_names() {
  std::vector<std::string> names;
  for (const auto& o : kOpNames) names.push_back(o.name);
  return names;
}

FuzzOp parse_fuzz_op(const std::string& name) {
  for (const auto& o : kOpNames)
    if (name == o.name) return o.op;
  throw Error("unknown fuzz op '" + name + "' (expected one of " + join(fuzz_op_names()) + ")");
}

const char* split_mode_name(SplitMode m) {
  switch (m) {
    case SplitMode::kDisabled:
      return "disabled";
    case SplitMode::kFixed:
      return "fixed";
    default:
      return "auto";
  }
}

std::string FuzzVariant::str() const {
  std::vector<std::string> parts;
  if (window_left >= 0) parts.push_back("window " + std::to_string(window_left));
  if (soft_cap > 0) parts.push_back("softcap " + std::to_string(static_cast<int>(soft_cap)));
  if (alibi) parts.push_back("alibi");
  if (sinks) parts.push_back("sinks");
  if (sigmoid) parts.push_back("sigmoid");
  if (custom_mask) parts.push_back("custom_mask");
  if (rope != RopeMode::none) parts.push_back(std::string("rope ") + rope_mode_name(rope));
  return join(parts, " + ");
}

std::string FuzzConfig::str() const {
  std::ostringstream os;
  auto list = [&](const std::vector<int64_t>& l) {
    os << "[";
    for (size_t i = 0; i < l.size(); ++i) os << (i ? "," : "") << l[i];
    os << "]";
  };
  os << fuzz_op_name(op) << " " << dtype_name(dtype);
  if (kv_dtype != dtype) os << "/kv " << dtype_name(kv_dtype);
  os << " D" << head_dim << " H" << num_qo_heads() << "/" << num_kv_heads;
  if (op != FuzzOp::kMerge && op != FuzzOp::kBlockSparse && op != FuzzOp::kVariableBlockSparse &&
      op != FuzzOp::kPrefillRagged)
    os << " page " << page_size << " " << kv_layout_name(layout);
  os << " kv ";
  list(kv_lens);
  if (!qo_lens.empty()) {
    os << " qo ";
    list(qo_lens);
  }
  if (causal) os << " causal";
  if (variant.any()) os << " {" << variant.str() << "}";
  if (split != SplitMode::kAuto) {
    os << " split " << split_mode_name(split);
    if (split == SplitMode::kFixed) os << " " << fixed_split_size;
  }
  if (cuda_graph) os << " graph";
  if (!with_lse) os << " no-lse";
  if (is_fp8_dtype(kv_dtype) && (k_scale != 1 || v_scale != 1))
    os << " scale " << k_scale << "/" << v_scale;
  if (op == FuzzOp::kCascade)
    os << " shared " << shared_pages << "p x" << share_group << (cascade_always ? " always" : "");
  if (op == FuzzOp::kBlockSparse || op == FuzzOp::kVariableBlockSparse)
    os << " blocks " << block_r << "x" << block_c << " " << density_pct << "%"
       << (element_mask ? " element-mask" : "");
  if (op == FuzzOp::kDecodeStep) os << " rope " << rope_mode_name(step_rope);
  if (op == FuzzOp::kMerge)
    os << " " << (merge_kind == 0 ? "merge_states" : merge_kind == 1 ? "merge_state" : "in_place");
  return os.str();
}

nlohmann::json to_json(const FuzzConfig& c) {
  return {{"seed", c.seed},
          {"op", fuzz_op_name(c.op)},
          {"dtype", dtype_name(c.dtype)},
          {"kv_dtype", dtype_name(c.kv_dtype)},
          {"head_dim", c.head_dim},
          {"num_kv_heads", c.num_kv_heads},
          {"group", c.group},
          {"page_size", c.page_size},
          {"layout", kv_layout_name(c.layout)},
          {"qo_lens", c.qo_lens},
          {"kv_lens", c.kv_lens},
          {"causal", c.causal},
          {"variant",
           {{"window_left", c.variant.window_left},
            {"soft_cap", c.variant.soft_cap},
            {"alibi", c.variant.alibi},
            {"sinks", c.variant.sinks},
            {"sigmoid", c.variant.sigmoid},
            {"custom_mask", c.variant.custom_mask},
            {"rope", rope_mode_name(c.variant.rope)}}},
          {"split", split_mode_name(c.split)},
          {"fixed_split_size", c.fixed_split_size},
          {"cuda_graph", c.cuda_graph},
          {"backend", c.backend},
          {"balance_tail", c.balance_tail},
          {"check_page_ids", c.check_page_ids},
          {"tile_rows", c.tile_rows},
          {"item_order", c.item_order},
          {"pdl", c.pdl},
          {"workspace_pct", c.workspace_pct},
          {"with_lse", c.with_lse},
          {"k_scale", c.k_scale},
          {"v_scale", c.v_scale},
          {"shared_pages", c.shared_pages},
          {"share_group", c.share_group},
          {"cascade_always", c.cascade_always},
          {"block_r", c.block_r},
          {"block_c", c.block_c},
          {"density_pct", c.density_pct},
          {"element_mask", c.element_mask},
          {"step_rope", rope_mode_name(c.step_rope)},
          {"merge_kind", c.merge_kind}};
}

namespace {
RopeMode parse_rope(const std::string& s) {
  for (RopeMode m : {RopeMode::none, RopeMode::llama, RopeMode::llama31})
    if (s == rope_mode_name(m)) return m;
  throw Error("rope: expected none, llama or llama31, got '" + s + "'");
}
SplitMode parse_split(const std::string& s) {
  for (SplitMode m : {SplitMode::kAuto, SplitMode::kDisabled, SplitMode::kFixed})
    if (s == split_mode_name(m)) return m;
  throw Error("split: expected auto, disabled or fixed, got '" + s + "'");
}
}  // namespace

FuzzConfig config_from_json(const nlohmann::json& j) {
  FuzzConfig c;
  try {
    c.seed = j.at("seed").get<uint64_t>();
    c.op = parse_fuzz_op(j.at("op").get<std::string>());
    c.dtype = parse_dtype(j.at("dtype").get<std::string>());
    c.kv_dtype = parse_dtype(j.at("kv_dtype").get<std::string>());
    c.head_dim = j.at("head_dim").get<int>();
    c.num_kv_heads = j.at("num_kv_heads").get<int>();
    c.group = j.at("group").get<int>();
    c.page_size = j.at("page_size").get<int>();
    c.layout = parse_kv_layout(j.at("layout").get<std::string>());
    c.qo_lens = j.at("qo_lens").get<std::vector<int64_t>>();
    c.kv_lens = j.at("kv_lens").get<std::vector<int64_t>>();
    c.causal = j.at("causal").get<bool>();
    const auto& v = j.at("variant");
    c.variant.window_left = v.at("window_left").get<int>();
    c.variant.soft_cap = v.at("soft_cap").get<float>();
    c.variant.alibi = v.at("alibi").get<bool>();
    c.variant.sinks = v.at("sinks").get<bool>();
    c.variant.sigmoid = v.at("sigmoid").get<bool>();
    c.variant.custom_mask = v.at("custom_mask").get<bool>();
    c.variant.rope = parse_rope(v.at("rope").get<std::string>());
    c.split = parse_split(j.at("split").get<std::string>());
    c.fixed_split_size = j.at("fixed_split_size").get<int>();
    c.cuda_graph = j.at("cuda_graph").get<bool>();
    c.backend = j.at("backend").get<int>();
    c.balance_tail = j.at("balance_tail").get<bool>();
    c.check_page_ids = j.at("check_page_ids").get<bool>();
    c.tile_rows = j.at("tile_rows").get<int>();
    c.item_order = j.at("item_order").get<int>();
    c.pdl = j.at("pdl").get<bool>();
    c.workspace_pct = j.at("workspace_pct").get<int>();
    c.with_lse = j.at("with_lse").get<bool>();
    c.k_scale = j.at("k_scale").get<float>();
    c.v_scale = j.at("v_scale").get<float>();
    c.shared_pages = j.at("shared_pages").get<int>();
    c.share_group = j.at("share_group").get<int>();
    c.cascade_always = j.at("cascade_always").get<bool>();
    c.block_r = j.at("block_r").get<int>();
    c.block_c = j.at("block_c").get<int>();
    c.density_pct = j.at("density_pct").get<int>();
    c.element_mask = j.at("element_mask").get<bool>();
    c.step_rope = parse_rope(j.at("step_rope").get<std::string>());
    c.merge_kind = j.at("merge_kind").get<int>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("fuzz configuration JSON: ") + e.what());
  }
  if (const std::string p = config_problem(c); !p.empty())
    throw Error("fuzz configuration JSON: " + p);
  return c;
}

FuzzConfig draw_config(uint64_t seed, const DrawLimits& limits, const std::vector<FuzzOp>& ops) {
  Draw d(seed);
  FuzzConfig c;
  c.seed = seed;
  if (ops.empty()) {
    // Weights: the ops serving engines call per layer get more of the draws.
    constexpr int kWeights[] = {20, 8, 6, 16, 10, 8, 8, 8, 6, 10};
    int total = 0;
    for (int w : kWeights) total += w;
    int r = static_cast<int>(d.below(total)), i = 0;
    while (r >= kWeights[i]) r -= kWeights[i++];
    c.op = kAllFuzzOps[i];
  } else {
    c.op = ops[d.below(ops.size())];
  }
  const bool cpu = limits.cpu_only;
  const int64_t typical = cpu ? 40 : 300, long_len = cpu ? 200 : 4096;
  const int max_batch = cpu ? 4 : 8;

  // The choices that select kernels come from the configuration's family (fuzz_config.h).
  Draw f(fuzz_family(seed) * 0x9E3779B97F4A7C15ull + 1);
  c.dtype = f.pick({DType::f16, DType::bf16});
  const bool fp8 = f.chance(0.35);
  const DType fp8_dtype = f.pick({DType::e4m3, DType::e5m2});
  c.head_dim = f.pick(kHeadDims);
  c.group = f.pick(kGroups);
  do {
    c.num_kv_heads = f.pick(kKVHeads);
  } while (c.num_kv_heads * c.group > 32);  // keeps the reference cheap; group 16 x 2 is MHA-size
  c.page_size = f.pick(kPageSizes);
  // CPU-only runs check plans, schedules and the reference, none of which page size changes
  // much; filling 64- and 128-token pages of short requests with random values was most of
  // their time (perf: HostTensor::fill_random), so they stop at 16.
  if (cpu) c.page_size = std::min(c.page_size, 16);
  c.kv_dtype = takes_fp8(c.op) && fp8 ? fp8_dtype : c.dtype;
  if (is_fp8_dtype(c.kv_dtype)) {
    c.k_scale = d.pick(kScales);
    c.v_scale = d.pick(kScales);
  }
  c.layout = d.chance(0.5) ? KVLayout::NHD : KVLayout::HND;
  c.with_lse = d.chance(0.8);

  const int batch = static_cast<int>(d.range(1, max_batch));
  switch (c.op) {
    case FuzzOp::kDecode:
    case FuzzOp::kDecodeStep:
      for (int i = 0; i < batch; ++i) c.kv_lens.push_back(draw_len(d, typical, long_len));
      if (c.op == FuzzOp::kDecodeStep) {
        for (auto& l : c.kv_lens) l = std::max<int64_t>(l, 1);  // the new token is in the plan
        c.step_rope = d.pick({RopeMode::none, RopeMode::llama, RopeMode::llama31});
      }
      break;
    case FuzzOp::kSparseDecode:
      c.layout = KVLayout::NHD;  // token_pages(): an HND cache's tokens are not evenly strided
      for (int i = 0; i < batch; ++i) c.kv_lens.push_back(draw_len(d, typical, long_len));
      if (sum(c.kv_lens) == 0) c.kv_lens[0] = 1;
      for (int i = 0; i < batch; ++i) c.qo_lens.push_back(draw_len(d, typical / 2, typical));
      break;
    case FuzzOp::kPrefillPaged:
    case FuzzOp::kPrefillRagged:
    case FuzzOp::kAppend:
      for (int i = 0; i < batch; ++i) {
        c.qo_lens.push_back(draw_len(d, c.op == FuzzOp::kAppend ? 40 : typical / 2, typical));
        c.kv_lens.push_back(draw_len(d, typical, long_len / 2));
      }
      if (sum(c.qo_lens) == 0) c.qo_lens[0] = 1;  // a batch with no query row runs nothing
      c.causal = is_prefill(c.op) && d.chance(0.6);
      break;
    case FuzzOp::kCascade: {
      c.share_group = static_cast<int>(d.range(1, 4));
      const int groups = static_cast<int>(d.range(1, cpu ? 2 : 3));
      c.shared_pages = static_cast<int>(d.range(0, c.page_size >= 64 ? 2 : 8));
      const bool append = d.chance(0.4);
      for (int i = 0; i < c.share_group * groups; ++i) {
        c.kv_lens.push_back(draw_len(d, typical / 2, long_len / 4));
        if (append) c.qo_lens.push_back(d.range(1, 8));
      }
      c.causal = d.chance(0.8);
      c.cascade_always = d.chance(0.5);
      break;
    }
    case FuzzOp::kBlockSparse:
      c.block_r = d.pick(kBlockR);
      c.block_c = d.pick(kBlockC);
      c.qo_lens = {c.block_r * d.range(1, cpu ? 4 : 12)};
      c.kv_lens = {c.block_c * d.range(1, cpu ? 6 : 16)};
      c.density_pct = d.pick(kDensity);
      c.element_mask = d.chance(0.3);
      c.causal = d.chance(0.4);
      break;
    case FuzzOp::kVariableBlockSparse:
      c.block_r = static_cast<int>(d.range(1, 6));  // MB
      c.block_c = static_cast<int>(d.range(1, 8));  // NB
      c.qo_lens = {d.range(1, cpu ? 48 : 200)};
      c.kv_lens = {d.range(1, cpu ? 64 : 400)};
      c.density_pct = d.pick(kDensity);
      c.causal = d.chance(0.4);
      break;
    case FuzzOp::kMerge:
      c.kv_dtype = c.dtype;
      c.num_kv_heads = static_cast<int>(d.range(1, cpu ? 8 : 16));
      c.group = 1;
      c.merge_kind = static_cast<int>(d.below(3));
      c.qo_lens = {d.range(1, cpu ? 32 : 300)};
      c.kv_lens = {c.merge_kind == 0 ? d.range(1, 6) : 2};
      c.with_lse = true;
      break;
  }
  if (takes_variant(c.op) && d.chance(0.3)) {
    int64_t max_kv = 1;
    for (int64_t l : c.kv_lens) max_kv = std::max(max_kv, l);
    draw_variant(d, c, max_kv);
  }
  if (c.op == FuzzOp::kBlockSparse || c.op == FuzzOp::kVariableBlockSparse) {
    // BlockSparseOptions: soft-cap, sinks, ALiBi + RoPE at the tokens' positions.
    if (d.chance(0.25)) {
      c.variant.soft_cap = 4.0f;
      c.variant.sinks = true;
    }
    if (d.chance(0.2)) {
      c.variant.alibi = true;
      c.variant.rope = RopeMode::llama;
    }
  }
  if (c.variant.sigmoid) c.with_lse = false;
  if (takes_split(c.op)) {
    const uint64_t s = d.below(20);
    if (s < 4) {
      c.split = SplitMode::kDisabled;
    } else if (s < 9) {
      c.split = SplitMode::kFixed;
      c.fixed_split_size = d.pick(kFixedSplits);
    }
  }
  if (takes_graph(c.op) && d.chance(0.25)) c.cuda_graph = true;
  if (is_decode_like(c.op)) {
    const bool tc_fits =
        (c.head_dim == 64 && c.group <= 32) || (c.head_dim == 128 && c.group <= 16);
    const uint64_t b = d.below(10);
    c.backend = b < 6 ? 0 : b < 8 ? 1 : tc_fits ? 2 : 1;
    c.balance_tail = c.split == SplitMode::kAuto && d.chance(0.2);
    c.check_page_ids = d.chance(0.2);
  }
  if (is_decode_like(c.op) || is_prefill(c.op)) {
    c.pdl = !d.chance(0.2);
    if (c.split != SplitMode::kFixed && d.chance(0.2)) c.workspace_pct = d.pick({0, 1, 10, 50});
  }
  if (is_prefill(c.op)) {
    c.backend = d.chance(0.2) ? 1 : 0;
    if (d.chance(0.3)) {
      do {
        c.tile_rows = d.pick({16, 32, 64, 128});
      } while (c.tile_rows < c.group);
    }
    c.item_order = static_cast<int>(d.below(3));
  }
  shrink_to_budget(c, cpu ? kCpuBudget : kGpuBudget);
  if (c.op == FuzzOp::kBlockSparse) {  // M, N must stay multiples of R, C
    c.qo_lens[0] = std::max<int64_t>(c.block_r, c.qo_lens[0] / c.block_r * c.block_r);
    c.kv_lens[0] = std::max<int64_t>(c.block_c, c.kv_lens[0] / c.block_c * c.block_c);
  }
  if (c.op == FuzzOp::kCascade && c.causal && c.shared_pages > 0) {
    // A causal row that starts inside the shared prefix cannot attend it unmasked
    // (reference_cascade.h): the suffix holds at least the request's query rows.
    for (size_t i = 0; i < c.qo_lens.size(); ++i)
      c.kv_lens[i] = std::max(c.kv_lens[i], c.qo_lens[i]);
  }
  if (c.variant.window_left >= 0) {
    int64_t max_kv = 0;
    for (int64_t l : c.kv_lens) max_kv = std::max(max_kv, l);
    c.variant.window_left = static_cast<int>(std::min<int64_t>(c.variant.window_left, max_kv));
  }
  if (is_prefill(c.op) && c.split == SplitMode::kFixed && !prefill_fixed_split_fits(c))
    c.split = SplitMode::kAuto, c.fixed_split_size = 0;
  return c;
}

std::string config_problem(const FuzzConfig& c) {
  auto in = [](int x, std::initializer_list<int> a) {
    return std::find(a.begin(), a.end(), x) != a.end();
  };
  if (c.dtype != DType::f16 && c.dtype != DType::bf16) return "dtype: expected f16 or bf16";
  if (c.kv_dtype != c.dtype && !is_fp8_dtype(c.kv_dtype))
    return "kv_dtype: expected the dtype, e4m3 or e5m2";
  if (is_fp8_dtype(c.kv_dtype) && !takes_fp8(c.op)) return "kv_dtype: the op takes no fp8";
  if (!(c.k_scale > 0) || !(c.v_scale > 0)) return "k_scale / v_scale: expected > 0";
  if (!is_fp8_dtype(c.kv_dtype) && (c.k_scale != 1 || c.v_scale != 1))
    return "k_scale / v_scale: a 16-bit cache takes no scales";
  if (!in(c.head_dim, {64, 128, 256})) return "head_dim: expected 64, 128 or 256";
  if (c.num_kv_heads < 1 || c.group < 1) return "num_kv_heads, group: expected >= 1";
  if (c.op != FuzzOp::kMerge && c.group > 16) return "group: expected <= 16";
  if (c.page_size < 1 || c.page_size > 128) return "page_size: expected 1..128";
  if (c.kv_lens.empty()) return "kv_lens: expected at least one request";
  for (int64_t l : c.kv_lens)
    if (l < 0) return "kv_lens: expected lengths >= 0";
  for (int64_t l : c.qo_lens)
    if (l < 0) return "qo_lens: expected lengths >= 0";
  const bool per_request_qo = is_prefill(c.op) || c.op == FuzzOp::kAppend ||
                              c.op == FuzzOp::kSparseDecode ||
                              (c.op == FuzzOp::kCascade && !c.qo_lens.empty());
  if (per_request_qo && c.qo_lens.size() != c.kv_lens.size())
    return "qo_lens: expected one length per request";
  if ((c.op == FuzzOp::kDecode || c.op == FuzzOp::kDecodeStep) && !c.qo_lens.empty())
    return "qo_lens: decode takes none";
  if (c.op == FuzzOp::kDecodeStep)
    for (int64_t l : c.kv_lens)
      if (l < 1) return "kv_lens: the decode step's plan counts the new token (>= 1)";
  if ((is_prefill(c.op) || c.op == FuzzOp::kAppend) && sum(c.qo_lens) == 0)
    return "qo_lens: expected at least one query row";
  if (c.op == FuzzOp::kSparseDecode && c.layout != KVLayout::NHD)
    return "layout: token_pages() takes NHD only";
  if (c.op == FuzzOp::kSparseDecode && sum(c.kv_lens) == 0)
    return "kv_lens: a token selection needs a token to select";
  if (c.variant.any() && !takes_variant(c.op) && c.op != FuzzOp::kBlockSparse &&
      c.op != FuzzOp::kVariableBlockSparse)
    return "variant: the op takes none";
  if (c.variant.sigmoid && (c.variant.sinks || c.with_lse))
    return "variant.sigmoid: no sinks and no lse (no softmax)";
  if (c.split == SplitMode::kFixed ? c.fixed_split_size < 1 : c.fixed_split_size != 0)
    return "fixed_split_size: >= 1 exactly when split is fixed";
  if (c.split != SplitMode::kAuto && !takes_split(c.op)) return "split: the op takes no option";
  if (c.cuda_graph && !takes_graph(c.op)) return "cuda_graph: the op is not captured";
  if (c.backend < 0 || c.backend > (is_decode_like(c.op) ? 2 : is_prefill(c.op) ? 1 : 0))
    return "backend: expected 0..2 (decode), 0..1 (prefill), 0 (other ops)";
  if (c.backend == 2 &&
      !((c.head_dim == 64 && c.group <= 32) || (c.head_dim == 128 && c.group <= 16)))
    return "backend: the tensor-core decode kernel does not fit this head_dim and group";
  if ((c.balance_tail || c.check_page_ids) && !is_decode_like(c.op))
    return "balance_tail / check_page_ids: decode options";
  if (c.balance_tail && c.split != SplitMode::kAuto) return "balance_tail: dynamic splitting only";
  if (c.tile_rows != 0 &&
      (!is_prefill(c.op) || !in(c.tile_rows, {16, 32, 64, 128}) || c.tile_rows < c.group))
    return "tile_rows: prefill only, 16, 32, 64 or 128, >= group";
  if (c.item_order < 0 || c.item_order > 2 || (c.item_order != 0 && !is_prefill(c.op)))
    return "item_order: prefill only, 0..2";
  if (!c.pdl && !is_decode_like(c.op) && !is_prefill(c.op)) return "pdl: decode and prefill only";
  if (c.workspace_pct != 100 &&
      (c.workspace_pct < 0 || c.workspace_pct > 100 || c.split == SplitMode::kFixed ||
       (!is_decode_like(c.op) && !is_prefill(c.op))))
    return "workspace_pct: 0..100, decode and prefill, not with a fixed split";
  if (c.op == FuzzOp::kCascade) {
    if (c.share_group < 1 || c.batch() % c.share_group != 0)
      return "share_group: expected >= 1, dividing the batch";
    if (c.shared_pages < 0) return "shared_pages: expected >= 0";
    if (c.causal)
      for (size_t i = 0; i < c.qo_lens.size(); ++i)
        if (c.shared_pages > 0 && c.kv_lens[i] < c.qo_lens[i] - 1)
          return "kv_lens: a causal row must see the shared prefix whole (suffix >= qo_len - 1)";
  }
  if (c.op == FuzzOp::kBlockSparse || c.op == FuzzOp::kVariableBlockSparse) {
    if (c.qo_lens.size() != 1 || c.kv_lens.size() != 1 || c.qo_lens[0] < 1 || c.kv_lens[0] < 1)
      return "qo_lens / kv_lens: one M >= 1 and one N >= 1";
    if (c.block_r < 1 || c.block_c < 1) return "block_r / block_c: expected >= 1";
    if (c.op == FuzzOp::kBlockSparse &&
        (c.qo_lens[0] % c.block_r != 0 || c.kv_lens[0] % c.block_c != 0))
      return "M, N: expected multiples of R, C";
    if (c.variant.window_left >= 0 || c.variant.sigmoid || c.variant.custom_mask ||
        c.variant.rope == RopeMode::llama31)
      return "variant: block-sparse takes soft-cap, sinks, ALiBi and llama RoPE only";
    if (c.element_mask && c.op != FuzzOp::kBlockSparse) return "element_mask: block-sparse only";
  }
  if (c.op == FuzzOp::kMerge) {
    if (c.qo_lens.size() != 1 || c.kv_lens.size() != 1 || c.qo_lens[0] < 1 || c.kv_lens[0] < 1)
      return "merge: one row count >= 1 and one state count >= 1";
    if (c.merge_kind < 0 || c.merge_kind > 2) return "merge_kind: expected 0, 1 or 2";
    if (c.merge_kind > 0 && c.kv_lens[0] != 2) return "merge_state: expected 2 states";
  }
  return "";
}

}  // namespace flashkv::cli
