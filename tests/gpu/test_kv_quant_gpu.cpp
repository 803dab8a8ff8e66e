// The quantized KV formats (kv_quant.h) on the GPU ops: no kernel reads them yet (issue 42), so
// BatchDecode, BatchPrefillPaged and MultiLevelCascade refuse every format at plan() with
// NotImplementedError naming it, and leave the op unplanned (a later plain plan still works).
// The run-time refusal of a CUDA cache in a format (validate_shapes) is tested on the CPU
// (KvQuantChecks.CudaCacheInAFormatIsNotImplementedAtRun).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/gpu_util.h"
#include "flashkv/cascade.h"
#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/prefill.h"
#include "flashkv/runtime.h"

namespace flashkv::test {
namespace {

struct Format {
  KVQuantFormat f;
  DType value;
};

const Format kFormats[] = {{{KVQuant::kFp8PerTokenHead, 0}, DType::e4m3},
                           {{KVQuant::kFp8PerTokenHead, 0}, DType::e5m2},
                           {{KVQuant::kInt4, 32}, DType::u8},
                           {{KVQuant::kInt4, 64}, DType::u8},
                           {{KVQuant::kInt4, 128}, DType::u8},
                           {{KVQuant::kNvfp4, 16}, DType::u8}};

// The NotImplementedError's message of `fn`, or "" (a test failure) when it throws nothing else.
template <class Fn>
std::string not_implemented(Fn&& fn) {
  try {
    fn();
  } catch (const NotImplementedError& e) {
    return e.what();
  } catch (const Error& e) {
    ADD_FAILURE() << "expected NotImplementedError, got Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected NotImplementedError";
  return "";
}

class KvQuantGpu : public GpuTest {};

TEST_F(KvQuantGpu, EveryGpuPlanRefusesEveryFormat) {
  const std::vector<int32_t> indptr = {0, 2}, last = {5}, qo = {0, 3};
  BatchDecodeConfig dcfg{.max_batch = 4, .num_qo_heads = 32, .head_dim = 128};
  DeviceBuffer dws(BatchDecode::workspace_bytes(dcfg));
  BatchDecode decode(dcfg, dws.data(), dws.size());
  BatchPrefillConfig pcfg{.max_batch = 4, .max_qo_tokens = 64, .num_qo_heads = 32, .head_dim = 128};
  DeviceBuffer pws(BatchPrefillPaged::workspace_bytes(pcfg));
  BatchPrefillPaged prefill(pcfg, pws.data(), pws.size());
  MultiLevelCascadeConfig ccfg{.max_batch = 4, .num_qo_heads = 32, .head_dim = 128};
  DeviceBuffer cws(MultiLevelCascade::workspace_bytes(ccfg));
  MultiLevelCascade cascade(ccfg, cws.data(), cws.size());
  const std::vector<int32_t> ids = {0, 1};
  for (const Format& fm : kFormats) {
    const std::string fmt = kv_format_name(fm.f, fm.value);
    AttentionShape sh{.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128, .kv_dtype = fm.value};
    sh.kv_format = fm.f;
    const DecodeBatch db{.kv_indptr = indptr.data(),
                         .kv_last_page_len = last.data(),
                         .batch_size = 1,
                         .page_size = 16};
    EXPECT_NE(not_implemented([&] { decode.plan(db, sh); }).find(fmt + " has no GPU kernel yet"),
              std::string::npos);
    const PrefillBatch pb{.qo_indptr = qo.data(),
                          .kv_indptr = indptr.data(),
                          .kv_last_page_len = last.data(),
                          .batch_size = 1,
                          .page_size = 16};
    EXPECT_NE(not_implemented([&] { prefill.plan(pb, sh); }).find("issue 42"), std::string::npos);
    CascadeShape cs{.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128, .kv_dtype = fm.value};
    cs.kv_format = fm.f;
    const CascadeBatch cb{.kv_indptr = indptr.data(),
                          .kv_indices = ids.data(),
                          .kv_last_page_len = last.data(),
                          .batch_size = 1,
                          .page_size = 16};
    EXPECT_NE(not_implemented([&] { cascade.plan(cb, cs); }).find(fmt), std::string::npos);
  }
  // Refused plans leave the ops usable: a plain plan goes through.
  AttentionShape plain{.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128};
  EXPECT_NO_THROW(decode.plan({.kv_indptr = indptr.data(),
                               .kv_last_page_len = last.data(),
                               .batch_size = 1,
                               .page_size = 16},
                              plain));
}

}  // namespace
}  // namespace flashkv::test
