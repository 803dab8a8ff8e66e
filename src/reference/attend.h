// Internals of the CPU reference backend, shared by attention.cpp, attention_paged.cpp,
// merge.cpp and the variant ops (variant_*.cpp). Not a public header.
//
// Every attention op reduces to one routine, attend_row(): one query row over a list of K/V rows,
// in double, with a max-subtracted softmax. The ops differ only in where the K/V rows of a request
// live (contiguous, ragged, paged; NHD or HND), which a KVSource describes as element offsets.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "flashkv/attention.h"
#include "flashkv/paged_kv.h"
#include "flashkv/tensor.h"

namespace flashkv::reference::detail {

inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The attention state (O, LSE) of one query row over the keys it saw (docs/design.md "Kernel
// families": ⊕). A row that saw no key is (0, -inf), the identity of ⊕.
struct RowState {
  std::vector<double> o;  // [D]
  double lse = kNegInf;   // natural log of the softmax denominator
};

// The keys and values of one (request, kv head), converted to double once so every query head of
// the GQA group and every query row of the request reuses them.
struct KVRows {
  int64_t len = 0;
  int dim = 0;
  std::vector<double> k;  // [len, dim]
  std::vector<double> v;  // [len, dim]
};

// Attends q[D] over the first `num_keys` rows of `kv` (num_keys <= kv.len; <= 0 gives (0, -inf)).
RowState attend_row(std::span<const double> q, const KVRows& kv, int64_t num_keys, double sm_scale);

// Where one request's rows of a quantized format's scale or zero-point pool live (kv_quant.h):
// undefined `t` when the format has no such pool.
struct GroupPool {
  TensorView t;
  std::vector<int64_t> token;  // [kv_len] element offset of token t's head-0 entries
  int64_t head_stride = 0, group_stride = 0;
};

// Where one request's K/V rows live in (possibly paged, strided) storage. K and V keep their own
// offsets and strides: separate k and v views need not share a layout in memory.
struct KVSource {
  TensorView k, v;
  std::vector<int64_t> k_token, v_token;  // [kv_len] element offset of token t at kv head 0
  int64_t k_head_stride = 0, v_head_stride = 0;
  int64_t k_dim_stride = 0, v_dim_stride = 0;
  KVScale scale;  // dequantization scales (host tensors): gather() multiplies by them
  // A quantized format's pools (scale.format not kNone; paged caches only): gather() dequantizes
  // each row through them (core/kv_quant_rows.h).
  GroupPool k_scales, v_scales, k_zeros, v_zeros;
  int64_t len() const { return static_cast<int64_t>(k_token.size()); }
};

// Tokens [begin, begin + len) of contiguous k, v in `layout` (NHD [tok, H, D] / HND [H, tok, D]).
// `scale`: the stored values' dequantization scales (attention.h), checked by the caller.
KVSource contiguous_source(const TensorView& k, const TensorView& v, KVLayout layout, int64_t begin,
                           int64_t len, const KVScale& scale = {});

// The f32 scale of kv head `head` (the float times the tensor's entry, when given), as the kernels
// and the quantizing append form it.
float head_scale(float factor, const TensorView& t, int head);

// Gathers kv head `head` of `src` into doubles, dequantized (times its scale) exactly.
KVRows gather(const KVSource& src, int head, int dim);

// Shapes of the query side of an op: q/out [rows, H_qo, D], lse f32 [rows, H_qo] or undefined.
struct QOShape {
  int64_t rows = 0;
  int num_qo_heads = 0;
  int head_dim = 0;
};
QOShape check_qo(const TensorView& q, const TensorView& out, const TensorView& lse);

// Checks contiguous k, v ([kv_len, H_kv, D] NHD / [H_kv, kv_len, D] HND) against q's head_dim
// and head count; returns {kv_len, H_kv}.
std::pair<int64_t, int> check_contiguous_kv(const TensorView& k, const TensorView& v,
                                            KVLayout layout, const QOShape& qo);

// The host-side view of a validated page table (attention_paged.cpp).
struct PageTable {
  std::vector<int64_t> indptr;
  std::vector<int64_t> indices;
  std::vector<int64_t> kv_len;  // per request
};

// Validates a host paged cache against q's shape (heads, head_dim) and reads its page table.
PageTable check_paged(const PagedKVCache& kv, const QOShape& qo);

// Request i's K/V rows. Offsets use each tensor's own strides (page, token, head), so k and v
// may be separate views with different memory layouts, or the two halves of an interleaved one.
KVSource paged_source(const PagedKVCache& kv, const PageTable& table, int i);

// One request of an op: query rows [q_begin, q_begin + qo_len) of q over the K/V rows of `kv`.
struct Request {
  int64_t q_begin = 0;
  int64_t qo_len = 0;
  KVSource kv;
};

// Attends each request's query rows over its KV for every query head and writes out and (when
// defined) lse at the same rows. Causal rows are aligned to the end of the request's KV.
// The (request, kv head) pairs run in parallel (parallel.h): each writes only its own rows and
// query heads, and computes every row exactly as a serial loop would, so the output does not
// depend on the thread count. Requests' query rows must not overlap.
void run_requests(const TensorView& q, const std::vector<Request>& requests, const TensorView& out,
                  const TensorView& lse, int num_kv_heads, double sm_scale, bool causal);

// Reads a host i32[batch + 1] prefix-sum array named `name`: starts at 0, non-decreasing, ends
// at `total` (the number of rows it splits, named `total_name` in the error message).
std::vector<int64_t> read_indptr(const TensorView& t, const char* name, int64_t total,
                                 const char* total_name);

// Argument checks every reference op shares; each names the argument.
void check_cpu(const TensorView& t, const char* name);
void check_floating(const TensorView& t, const char* name);

// Inserts a leading dimension of size 1 (decode's [H, D] -> [1, H, D]); undefined stays undefined.
TensorView unsqueeze0(const TensorView& t);

}  // namespace flashkv::reference::detail
