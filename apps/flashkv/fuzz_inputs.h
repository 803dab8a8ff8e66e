// `flashkv fuzz`: the host inputs of a configuration, drawn from its seed, and the CPU reference
// of the attention ops over them. The GPU run and the CPU-only run build the same inputs.
#pragma once

#include <memory>
#include <vector>

#include "flashkv/host_tensor.h"
#include "flashkv/reference_variants.h"
#include "flashkv/runtime.h"
#include "flashkv/variants.h"
#include "fuzz_config.h"
#include "host_inputs.h"

namespace flashkv::cli {

// Decode, sparse decode, decode step, prefill (paged and ragged) and cascade.
struct AttentionInputs {
  std::unique_ptr<RandomPagedCache> cache;  // over c.kv_lens, with c's scales
  HostTensor q;                             // [rows, H_qo, D]
  std::vector<int64_t> rows;                // request i's rows: [rows[i], rows[i + 1])
  std::vector<int32_t> qo_indptr;           // the same as i32 (prefill)
  // The variant's tensors (host): ALiBi slopes and sinks f32 [H_qo], the packed custom mask.
  HostTensor alibi, sinks;
  std::vector<uint8_t> mask_bits;
  std::vector<int32_t> mask_indptr;
  AttentionVariant variant;  // c's variant over the host tensors above (causal: c.causal)

  TensorView qo_indptr_view() const;
  // The same logical KV as contiguous ragged tensors [sum kv_lens, H_kv, D] (prefill_ragged).
  void ragged_kv(HostTensor& k, HostTensor& v, std::vector<int32_t>& kv_indptr) const;
};
AttentionInputs make_attention_inputs(const FuzzConfig& c);

// The CPU reference of c's op (decode or prefill, with its variant) into out f32 [rows, H_qo, D]
// and lse f32 [rows, H_qo] (lse may be undefined), over keys [chunk.begin, chunk.end) only.
void attention_reference(const FuzzConfig& c, const AttentionInputs& in, const TensorView& out,
                         const TensorView& lse, const reference::KVChunk& chunk = {});

// c's variant with its tensors copied to the device (into `keep`).
AttentionVariant device_variant(const AttentionInputs& in, std::vector<DeviceBuffer>& keep);

// Seeds of the independent streams of one configuration (q, KV, selections, masks).
uint64_t derive_seed(uint64_t seed, uint64_t salt);

}  // namespace flashkv::cli
