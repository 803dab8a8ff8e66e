// CPU reference of the KV-cache append (kv_ops.h): checks every destination before writing any,
// then copies each new token's k and v rows into its page slot. Elements are copied bit for bit
// when the new rows have the cache's dtype, and quantized with the cache's scales when f16 / bf16
// / f32 rows go into an fp8 cache; a quantized format (kv_quant.h) gets each row quantized with
// the group scales it computes (kv_quantize.h), written beside it in the scale pools.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/kv_ops_checks.h"
#include "core/kv_quant_rows.h"
#include "core/parallel.h"
#include "flashkv/error.h"
#include "flashkv/reference_kv_ops.h"
#include "reference/attend.h"

namespace flashkv::reference {
namespace {

int64_t i32_at(const TensorView& t, int64_t i) {
  return t.data_as<const int32_t>()[i * t.stride(0)];
}

// Where token t of the append goes: page id and slot within the page.
struct Destination {
  int64_t page = 0;
  int64_t slot = 0;
};

// The destination of every new token, or flashkv::Error naming the first bad one. Also rejects
// two tokens that land on the same slot: their order would decide the cache contents (and on the
// GPU they race).
std::vector<Destination> destinations(const TensorView& batch_indices, const TensorView& positions,
                                      const PagedKVCache& kv, int64_t nnz) {
  const int64_t batch = kv.batch_size(), page_size = kv.page_size();
  std::vector<Destination> dst(nnz);
  for (int64_t t = 0; t < nnz; ++t) {
    const int64_t b = i32_at(batch_indices, t), p = i32_at(positions, t);
    check(b >= 0 && b < batch, "batch_indices[", t, "] = ", b,
          " is out of range: expected 0 <= index < ", batch, " (paged_kv batch)");
    check(p >= 0, "positions[", t, "] = ", p, ": expected >= 0");
    const int64_t kv_len = kv.kv_len(static_cast<int>(b));
    check(p < kv_len, "positions[", t, "] = ", p, " is out of range for request ", b,
          ": its pages hold kv_len = ", kv_len,
          " tokens (paged_kv must describe the cache after the append, new tokens included)");
    const int64_t entry = i32_at(kv.indptr, b) + p / page_size;
    dst[t] = {i32_at(kv.indices, entry), p % page_size};
  }
  std::vector<std::pair<int64_t, int64_t>> by_slot(nnz);  // (global slot, token)
  for (int64_t t = 0; t < nnz; ++t) by_slot[t] = {dst[t].page * page_size + dst[t].slot, t};
  std::sort(by_slot.begin(), by_slot.end());
  for (int64_t i = 1; i < nnz; ++i) {
    if (by_slot[i].first != by_slot[i - 1].first) continue;
    const int64_t t0 = by_slot[i - 1].second, t1 = by_slot[i].second;
    fail("batch_indices/positions: tokens ", t0, " (request ", i32_at(batch_indices, t0),
         ", position ", i32_at(positions, t0), ") and ", t1, " (request ",
         i32_at(batch_indices, t1), ", position ", i32_at(positions, t1), ") both write slot ",
         dst[t1].slot, " of page ", dst[t1].page);
  }
  return dst;
}

// Copies row (t, h) of `src` [nnz, H, D] to element offset `dst_offset` of `dst`.
void copy_row(const TensorView& src, int64_t t, int64_t h, const TensorView& dst,
              int64_t dst_offset, int64_t head_dim) {
  const size_t es = dtype_size(src.dtype());
  const auto* from = static_cast<const std::byte*>(src.data()) +
                     (t * src.stride(0) + h * src.stride(1)) * static_cast<int64_t>(es);
  auto* to = static_cast<std::byte*>(dst.data()) + dst_offset * static_cast<int64_t>(es);
  std::memcpy(to, from, static_cast<size_t>(head_dim) * es);
}

// Row (t, h) of `src` [nnz, H, D] (f16 / bf16 / f32) quantized into fp8 `dst` at `dst_offset`:
// float(x) / scale in f32, rounded to nearest even and saturated (dtype.h), as the GPU does.
void quantize_row(const TensorView& src, int64_t t, int64_t h, const TensorView& dst,
                  int64_t dst_offset, int64_t head_dim, float scale) {
  const int64_t first = t * src.stride(0) + h * src.stride(1);
  auto* to = static_cast<uint8_t*>(dst.data()) + dst_offset;
  for (int64_t d = 0; d < head_dim; ++d) {
    const float x = static_cast<float>(load_as_double(src.data(), src.dtype(), first + d)) / scale;
    to[d] = dst.dtype() == DType::e4m3 ? float_to_e4m3(x, /*saturate=*/true)
                                       : float_to_e5m2(x, /*saturate=*/true);
  }
}

// Entry (page, slot, head) of a group pool laid out as the cache (kv_quant.h).
flashkv::detail::GroupEntries pool_at(const TensorView& t, KVLayout layout, const Destination& d,
                                      int64_t head) {
  if (!t.defined()) return {};
  const bool nhd = layout == KVLayout::NHD;
  const int64_t offset =
      d.page * t.stride(0) + d.slot * t.stride(nhd ? 1 : 2) + head * t.stride(nhd ? 2 : 1);
  auto* p = static_cast<char*>(t.data()) + offset * static_cast<int64_t>(dtype_size(t.dtype()));
  return {p, t.dtype(), t.stride(3)};
}

// Row (t, h) of `src` [nnz, H, D] as f32, refused (naming it) when an element is not finite.
std::vector<float> finite_row(const TensorView& src, const char* name, int64_t t, int64_t h,
                              int64_t dim) {
  std::vector<float> row(dim);
  const int64_t first = t * src.stride(0) + h * src.stride(1);
  for (int64_t d = 0; d < dim; ++d) {
    row[d] = static_cast<float>(load_as_double(src.data(), src.dtype(), first + d));
    check(std::isfinite(row[d]), name, "[", t, ", ", h, ", ", d, "] = ", row[d],
          ": expected finite values (a quantized cache format has no NaN / inf code)");
  }
  return row;
}

// The quantizing append into a quantized format: every new row is read and checked first, then
// each (token, head) row is quantized with its own group scales into its slot and the pools.
void append_quantized(const TensorView& append_key, const TensorView& append_value,
                      const std::vector<Destination>& dst, const PagedKVCache& kv) {
  const int64_t nnz = static_cast<int64_t>(dst.size());
  const int64_t heads = kv.num_kv_heads(), dim = kv.head_dim();
  std::vector<std::vector<float>> k_rows(nnz * heads), v_rows(nnz * heads);
  for (int64_t t = 0; t < nnz; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      k_rows[t * heads + h] = finite_row(append_key, "append_key", t, h, dim);
      v_rows[t * heads + h] = finite_row(append_value, "append_value", t, h, dim);
    }
  }
  const KVScale& s = kv.scale;
  auto* k_bytes = static_cast<char*>(kv.k.data());  // 1-byte elements
  auto* v_bytes = static_cast<char*>(kv.v.data());
  flashkv::detail::parallel_for(nnz, [&](int64_t t) {
    const int64_t slot_offset = dst[t].page * kv.page_stride() + dst[t].slot * kv.token_stride();
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t offset = slot_offset + h * kv.head_stride();
      const int hh = static_cast<int>(h);
      flashkv::detail::quantize_row(
          s.format, kv.k.dtype(), k_rows[t * heads + h].data(), static_cast<int>(dim),
          detail::head_scale(s.k, s.k_tensor, hh), k_bytes + offset,
          pool_at(s.k_group_scale, kv.layout, dst[t], h), pool_at(s.k_zero, kv.layout, dst[t], h));
      flashkv::detail::quantize_row(
          s.format, kv.v.dtype(), v_rows[t * heads + h].data(), static_cast<int>(dim),
          detail::head_scale(s.v, s.v_tensor, hh), v_bytes + offset,
          pool_at(s.v_group_scale, kv.layout, dst[t], h), pool_at(s.v_zero, kv.layout, dst[t], h));
    }
  });
}

}  // namespace

void append_paged_kv_cache(const TensorView& append_key, const TensorView& append_value,
                           const TensorView& batch_indices, const TensorView& positions,
                           const PagedKVCache& paged_kv) {
  const int64_t nnz = flashkv::detail::check_append_tensors(append_key, append_value, batch_indices,
                                                            positions, paged_kv);
  detail::check_cpu(append_key, "append_key");
  detail::check_cpu(append_value, "append_value");
  detail::check_cpu(batch_indices, "batch_indices");
  detail::check_cpu(positions, "positions");
  detail::check_cpu(paged_kv.k, "paged_kv.k");
  detail::check_cpu(paged_kv.v, "paged_kv.v");
  paged_kv.validate();
  const std::vector<Destination> dst = destinations(batch_indices, positions, paged_kv, nnz);
  if (!paged_kv.scale.format.is_none()) {
    append_quantized(append_key, append_value, dst, paged_kv);
    return;
  }

  const int64_t heads = paged_kv.num_kv_heads(), dim = paged_kv.head_dim();
  // Rows of another dtype than the cache's go into an fp8 cache, quantized (kv_ops.h).
  const bool quantize = append_key.dtype() != paged_kv.k.dtype();
  // Destinations are distinct, so tokens write disjoint slots and run in parallel.
  flashkv::detail::parallel_for(nnz, [&](int64_t t) {
    const int64_t slot_offset =
        dst[t].page * paged_kv.page_stride() + dst[t].slot * paged_kv.token_stride();
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t offset = slot_offset + h * paged_kv.head_stride();
      if (quantize) {
        const int hh = static_cast<int>(h);
        quantize_row(append_key, t, h, paged_kv.k, offset, dim,
                     detail::head_scale(paged_kv.scale.k, paged_kv.scale.k_tensor, hh));
        quantize_row(append_value, t, h, paged_kv.v, offset, dim,
                     detail::head_scale(paged_kv.scale.v, paged_kv.scale.v_tensor, hh));
      } else {
        copy_row(append_key, t, h, paged_kv.k, offset, dim);
        copy_row(append_value, t, h, paged_kv.v, offset, dim);
      }
    }
  });
}

void get_batch_indices_positions(const TensorView& append_indptr, const TensorView& seq_lens,
                                 const TensorView& batch_indices, const TensorView& positions) {
  const int64_t batch = flashkv::detail::check_batch_indices_args(append_indptr, seq_lens);
  detail::check_cpu(seq_lens, "seq_lens");
  detail::check_cpu(batch_indices, "batch_indices");
  detail::check_cpu(positions, "positions");
  flashkv::detail::check_i32_vector(batch_indices, "batch_indices", -1);
  const int64_t nnz = batch_indices.size(0);
  flashkv::detail::check_i32_vector(positions, "positions", nnz);
  const std::vector<int64_t> ptr =
      detail::read_indptr(append_indptr, "append_indptr", nnz, "nnz (batch_indices.size(0))");
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t append_len = ptr[i + 1] - ptr[i], seq_len = i32_at(seq_lens, i);
    check(seq_len >= append_len, "seq_lens[", i, "] = ", seq_len, " is less than request ", i,
          "'s append length ", append_len, " (append_indptr[", i + 1, "] - append_indptr[", i,
          "]): seq_lens are the lengths after the append");
    for (int64_t j = 0; j < append_len; ++j) {
      const int64_t t = ptr[i] + j;
      batch_indices.data_as<int32_t>()[t * batch_indices.stride(0)] = static_cast<int32_t>(i);
      positions.data_as<int32_t>()[t * positions.stride(0)] =
          static_cast<int32_t>(seq_len - append_len + j);
    }
  }
}

}  // namespace flashkv::reference
