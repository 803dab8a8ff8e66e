// Host helpers of variants.h: RoPE frequencies and FlashInfer's packed custom-mask layout.
#include "flashkv/variants.h"

#include <algorithm>
#include <cmath>

#include "flashkv/error.h"
#include "flashkv/rope_frequencies.h"

namespace flashkv {

const char* rope_mode_name(RopeMode m) {
  switch (m) {
    case RopeMode::none:
      return "none";
    case RopeMode::llama:
      return "llama";
    case RopeMode::llama31:
      return "llama31";
  }
  return "?";
}

std::vector<double> rope_frequencies(const RopeParams& p, int dim) {
  // One formula for RoPE frequencies in the library (rope.h); a variant's RoPE rotates the whole
  // head (rotary_dim = head_dim).
  if (p.mode != RopeMode::llama31) {
    RopeOptions o;
    o.rope_scale = p.rope_scale;
    o.rope_theta = p.rope_theta;
    return rope_frequencies(dim, o);
  }
  Llama31RopeOptions o;
  o.rope_scale = p.rope_scale;
  o.rope_theta = p.rope_theta;
  o.low_freq_factor = p.low_freq_factor;
  o.high_freq_factor = p.high_freq_factor;
  o.old_context_len = p.old_context_len;
  return rope_frequencies(dim, o);
}

std::vector<uint8_t> pack_custom_mask(const std::vector<bool>& mask,
                                      const std::vector<int64_t>& qo_lens,
                                      const std::vector<int64_t>& kv_lens,
                                      std::vector<int32_t>& mask_indptr) {
  check(qo_lens.size() == kv_lens.size(), "pack_custom_mask: ", qo_lens.size(), " qo_lens but ",
        kv_lens.size(), " kv_lens");
  mask_indptr.assign(1, 0);
  int64_t total_bits = 0, total_bytes = 0;
  for (size_t b = 0; b < qo_lens.size(); ++b) {
    const int64_t bits = qo_lens[b] * kv_lens[b];
    total_bits += bits;
    total_bytes += (bits + 7) / 8;
    mask_indptr.push_back(static_cast<int32_t>(total_bytes));
  }
  check(static_cast<int64_t>(mask.size()) == total_bits, "pack_custom_mask: mask has ", mask.size(),
        " entries, the requests need ", total_bits);
  std::vector<uint8_t> bytes(total_bytes, 0);
  int64_t src = 0;
  for (size_t b = 0; b < qo_lens.size(); ++b) {
    const int64_t bits = qo_lens[b] * kv_lens[b];
    for (int64_t n = 0; n < bits; ++n, ++src) {
      if (mask[src]) bytes[mask_indptr[b] + n / 8] |= static_cast<uint8_t>(1u << (n % 8));
    }
  }
  return bytes;
}

}  // namespace flashkv
