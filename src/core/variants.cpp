// Host helpers of variants.h: RoPE frequencies and FlashInfer's packed custom-mask layout.
#include "flashkv/variants.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "flashkv/error.h"

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
  check(dim > 0 && dim % 2 == 0, "rope: head_dim must be even and positive, got ", dim);
  check(p.rope_theta > 0, "rope.rope_theta must be positive, got ", p.rope_theta);
  check(p.rope_scale > 0, "rope.rope_scale must be positive, got ", p.rope_scale);
  const double scale = p.rope_scale;
  std::vector<double> freq(dim / 2);
  for (int d = 0; d < dim / 2; ++d) {
    const double f = std::pow(static_cast<double>(p.rope_theta), -2.0 * d / dim);
    if (p.mode != RopeMode::llama31) {
      freq[d] = f / scale;
      continue;
    }
    // Llama 3.1: wavelengths above old_context_len / low_freq_factor are interpolated (f / scale),
    // those below old_context_len / high_freq_factor kept, a linear blend in between.
    const double lo = p.low_freq_factor, hi = p.high_freq_factor;
    check(hi > lo, "rope.high_freq_factor (", hi, ") must exceed rope.low_freq_factor (", lo, ")");
    const double smooth = std::clamp(
        f * p.old_context_len / (2 * std::numbers::pi * (hi - lo)) - lo / (hi - lo), 0.0, 1.0);
    freq[d] = (1 - smooth) * f / scale + smooth * f;
  }
  return freq;
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
