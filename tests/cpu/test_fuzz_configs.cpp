// `flashkv fuzz`'s configuration drawer (apps/flashkv/fuzz_config.h): the same seed gives the same
// configuration, every drawn configuration is one the ops accept, and a few thousand draws cover
// every op and option; its judge rejects NaN and errors past the tolerance rule; and the CPU-only
// regression files of tests/fuzz_regressions/ still pass.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "fuzz_check.h"
#include "fuzz_config.h"
#include "fuzz_ops.h"

namespace flashkv::cli {
namespace {

TEST(FuzzConfigs, SameSeedSameConfiguration) {
  for (bool cpu : {false, true}) {
    for (uint64_t s = 1; s < 300; ++s) {
      const nlohmann::json a = to_json(draw_config(s, {.cpu_only = cpu}));
      EXPECT_EQ(a, to_json(draw_config(s, {.cpu_only = cpu}))) << "seed " << s;
      EXPECT_EQ(a, to_json(config_from_json(a))) << "JSON round trip, seed " << s;
    }
  }
  int differ = 0;
  for (uint64_t s = 1; s < 50; ++s)
    differ += to_json(draw_config(s, {})) != to_json(draw_config(s + 1, {}));
  EXPECT_EQ(differ, 49);
}

TEST(FuzzConfigs, EveryDrawnConfigurationIsValid) {
  for (bool cpu : {false, true})
    for (uint64_t s = 1; s <= 5000; ++s) {
      const FuzzConfig c = draw_config(s, {.cpu_only = cpu});
      ASSERT_EQ(config_problem(c), "") << "seed " << s << ": " << c.str();
    }
}

TEST(FuzzConfigs, OpsFilterDrawsOnlyThoseOps) {
  for (uint64_t s = 1; s < 200; ++s) {
    const FuzzOp op = draw_config(s, {}, {FuzzOp::kMerge, FuzzOp::kCascade}).op;
    EXPECT_TRUE(op == FuzzOp::kMerge || op == FuzzOp::kCascade);
  }
}

// 5 000 draws (half a GPU run) reach every value of every option the drawer knows.
TEST(FuzzConfigs, DrawsCoverEveryOpAndOption) {
  std::set<std::string> seen;
  auto mark = [&](const std::string& k) { seen.insert(k); };
  for (uint64_t s = 1; s <= 5000; ++s) {
    const FuzzConfig c = draw_config(s, {});
    const std::string op = fuzz_op_name(c.op);
    mark("op " + op);
    mark(std::string("dtype ") + dtype_name(c.dtype));
    if (c.kv_dtype != c.dtype) mark(op + " kv " + dtype_name(c.kv_dtype));
    mark("head_dim " + std::to_string(c.head_dim));
    mark("group " + std::to_string(c.group));
    if (c.num_kv_heads == 1 && c.group > 1) mark("mqa");
    if (c.op != FuzzOp::kMerge && c.op != FuzzOp::kBlockSparse &&
        c.op != FuzzOp::kVariableBlockSparse && c.op != FuzzOp::kPrefillRagged) {
      mark("page " + std::to_string(c.page_size));
      mark(std::string("layout ") + kv_layout_name(c.layout));
    }
    for (int64_t l : c.kv_lens) {
      if (l == 0) mark("empty request");
      if (l == 1) mark("length-1 request");
      if (l >= 2048) mark("long request");
    }
    if (c.causal) mark(op + " causal");
    if (c.split != SplitMode::kAuto) mark(op + " split " + split_mode_name(c.split));
    if (c.cuda_graph) mark(op + " graph");
    if (c.backend) mark(op + " backend " + std::to_string(c.backend));
    if (c.balance_tail) mark(op + " balance_tail");
    if (c.check_page_ids) mark(op + " check_page_ids");
    if (c.tile_rows) mark(op + " tile " + std::to_string(c.tile_rows));
    if (c.item_order) mark(op + " order " + std::to_string(c.item_order));
    if (!c.pdl) mark(op + " no pdl");
    if (c.workspace_pct != 100) mark(op + " workspace " + std::to_string(c.workspace_pct));
    if (!c.with_lse) mark("no lse");
    const FuzzVariant& v = c.variant;
    if (v.window_left >= 0) mark(op + " window");
    if (v.soft_cap > 0) mark(op + " softcap");
    if (v.alibi) mark(op + " alibi");
    if (v.sinks) mark(op + " sinks");
    if (v.sigmoid) mark(op + " sigmoid");
    if (v.custom_mask) mark(op + " custom_mask");
    if (v.rope != RopeMode::none) mark(op + " rope " + rope_mode_name(v.rope));
    if (c.op == FuzzOp::kDecodeStep) mark(std::string("step rope ") + rope_mode_name(c.step_rope));
    if (c.op == FuzzOp::kMerge) mark("merge kind " + std::to_string(c.merge_kind));
    if (c.element_mask) mark("element mask");
    if (c.op == FuzzOp::kCascade) {
      mark(c.cascade_always ? "cascade always" : "cascade auto");
      if (c.shared_pages > 0 && c.share_group > 1) mark("shared prefix");
      mark(c.qo_lens.empty() ? "cascade decode" : "cascade append");
    }
  }
  std::vector<std::string> want;
  for (const auto& name : fuzz_op_names()) want.push_back("op " + name);
  for (const char* s :
       {"dtype f16",    "dtype bf16",    "head_dim 64",    "head_dim 128",    "head_dim 256",
        "group 1",      "group 4",       "group 7",        "group 8",         "group 16",
        "mqa",          "page 1",        "page 3",         "page 16",         "page 64",
        "page 128",     "layout NHD",    "layout HND",     "empty request",   "length-1 request",
        "long request", "no lse",        "step rope none", "step rope llama", "step rope llama31",
        "merge kind 0", "merge kind 1",  "merge kind 2",   "element mask",    "cascade always",
        "cascade auto", "shared prefix", "cascade decode", "cascade append"})
    want.push_back(s);
  for (const char* op :
       {"decode", "decode_step", "sparse_decode", "prefill_paged", "prefill_ragged", "append",
        "cascade", "block_sparse", "variable_block_sparse"})
    for (const char* kv : {"e4m3", "e5m2"}) want.push_back(std::string(op) + " kv " + kv);
  for (const char* op : {"decode", "prefill_paged", "prefill_ragged"}) {
    for (const char* f : {"window", "softcap", "alibi", "sinks", "sigmoid", "custom_mask",
                          "rope llama", "rope llama31"})
      want.push_back(std::string(op) + " " + f);
  }
  for (const char* op :
       {"decode", "decode_step", "sparse_decode", "prefill_paged", "prefill_ragged"})
    for (const char* m : {"split disabled", "split fixed"})
      want.push_back(std::string(op) + " " + m);
  for (const char* op :
       {"decode", "decode_step", "sparse_decode", "prefill_paged", "prefill_ragged", "cascade"})
    want.push_back(std::string(op) + " graph");
  for (const char* op :
       {"prefill_paged", "prefill_ragged", "cascade", "block_sparse", "variable_block_sparse"})
    want.push_back(std::string(op) + " causal");
  for (const char* op : {"block_sparse", "variable_block_sparse"})
    for (const char* f : {"softcap", "sinks", "alibi", "rope llama"})
      want.push_back(std::string(op) + " " + f);
  for (const auto& w : want) EXPECT_TRUE(seen.count(w)) << "never drawn: " << w;
}

TEST(FuzzConfigs, JudgeRejectsNaNAndLargeErrors) {
  HostTensor ref(DType::f32, {4, 8}), got(DType::f16, {4, 8});
  ref.fill_random(1);
  for (int64_t i = 0; i < ref.numel(); ++i) got.set(i, ref.get(i));
  FuzzOutcome ok;
  ok.check_output("out", got, ref, DType::f16, {0, 2, 4});
  EXPECT_TRUE(ok.pass) << ok.detail;
  HostTensor nan = got;
  nan.set(5, std::nan(""));
  FuzzOutcome o1;
  o1.check_output("out", nan, ref, DType::f16);
  EXPECT_FALSE(o1.pass);
  HostTensor off = got;
  for (int64_t i = 0; i < 8; ++i) off.set(i, got.get(i) * 1.02);  // request 0 is 2 % off
  FuzzOutcome o2;
  o2.check_output("out", off, ref, DType::f16, {0, 1, 4});
  EXPECT_FALSE(o2.pass);
  EXPECT_NE(o2.detail.find("request 0"), std::string::npos) << o2.detail;
}

std::filesystem::path regressions_dir() {
  if (const char* env = std::getenv("FLASHKV_FUZZ_REGRESSIONS_DIR")) return env;
  if (std::filesystem::is_directory(FLASHKV_FUZZ_REGRESSIONS_DIR))
    return FLASHKV_FUZZ_REGRESSIONS_DIR;
  return "tests/fuzz_regressions";
}

// Every regression file parses into a valid configuration; the CPU-only ones pass here (the
// GPU ones: FuzzRegressionsGpu).
TEST(FuzzConfigs, RegressionFilesParseAndCpuOnesPass) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(regressions_dir())) {
    if (e.path().extension() != ".json") continue;
    ++files;
    std::ifstream in(e.path());
    const nlohmann::json j = nlohmann::json::parse(in);
    const FuzzConfig c = config_from_json(j.at("config"));
    if (j.at("cpu_only").get<bool>()) {
      const FuzzOutcome o = run_on_cpu(c);
      EXPECT_TRUE(o.pass) << e.path() << ": " << o.detail;
    }
  }
  EXPECT_GT(files, 0) << "no regression files in " << regressions_dir();
}

}  // namespace
}  // namespace flashkv::cli
