#include "fuzz_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "flashkv/kv_ops.h"
#include "flashkv/reference.h"
#include "flashkv/reference_kv_ops.h"
#include "flashkv/rope.h"

namespace flashkv::cli {
namespace {

TensorView i32_view(const std::vector<int32_t>& v) {
  return TensorView(const_cast<int32_t*>(v.data()), DType::i32, {static_cast<int64_t>(v.size())});
}

HostTensor i32_tensor(const std::vector<int64_t>& v) {
  HostTensor t(DType::i32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(v[i]));
  return t;
}

// `n` cut into `parts` sizes >= 0 (random cut points).
std::vector<int32_t> composition(SplitMix64& rng, int64_t n, int64_t parts) {
  std::vector<int64_t> cuts{0, n};
  for (int64_t i = 0; i + 1 < parts; ++i)
    cuts.push_back(static_cast<int64_t>(rng.next() % static_cast<uint64_t>(n + 1)));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int32_t> sizes;
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    sizes.push_back(static_cast<int32_t>(cuts[i + 1] - cuts[i]));
  return sizes;
}

}  // namespace

SparseSelection draw_token_selection(const FuzzConfig& c, const RandomPagedCache& cache) {
  SparseSelection s;
  const int64_t slots = cache.num_pages() * c.page_size;
  SplitMix64 rng(derive_seed(c.seed, 7));
  std::vector<int32_t> pool(slots);
  std::iota(pool.begin(), pool.end(), 0);
  s.indptr = {0};
  for (int64_t want : c.qo_lens) {
    const int64_t n = std::min(want, slots);
    for (int64_t i = 0; i < n; ++i) {  // a partial Fisher-Yates: n distinct slots
      std::swap(pool[i], pool[i + static_cast<int64_t>(rng.next() % (slots - i))]);
      s.ids.push_back(pool[i]);
    }
    s.indptr.push_back(static_cast<int32_t>(s.ids.size()));
    s.last.push_back(n > 0 ? 1 : 0);
  }
  s.host.k = token_pages(cache.host.k, KVLayout::NHD);
  s.host.v = token_pages(cache.host.v, KVLayout::NHD);
  s.host.layout = KVLayout::NHD;
  s.host.indptr = i32_view(s.indptr);
  s.host.indices = i32_view(s.ids);
  s.host.last_page_len = i32_view(s.last);
  s.host.scale = cache.host.scale;
  return s;
}

StepInputs make_step_inputs(const FuzzConfig& c, const AttentionInputs& in) {
  StepInputs st;
  const int64_t B = c.batch();
  st.new_k = HostTensor(c.dtype, {B, c.num_kv_heads, c.head_dim});
  st.new_v = HostTensor(c.dtype, {B, c.num_kv_heads, c.head_dim});
  st.new_k.fill_random(derive_seed(c.seed, 5));
  st.new_v.fill_random(derive_seed(c.seed, 6));
  std::vector<int64_t> pos, bi;
  for (int64_t b = 0; b < B; ++b) {
    pos.push_back(in.cache->host.kv_len(static_cast<int>(b)) - 1);
    bi.push_back(b);
  }
  st.pos = i32_tensor(pos);
  st.batch_indices = i32_tensor(bi);
  st.positions = i32_tensor(pos);
  return st;
}

void step_reference(const FuzzConfig& c, const StepInputs& st, AttentionInputs& in,
                    const TensorView& out, const TensorView& lse) {
  HostTensor q_rope = in.q, k_rope = st.new_k;
  if (c.step_rope == RopeMode::llama)
    reference::apply_rope_pos_ids(in.q.view(), st.new_k.view(), q_rope.view(), k_rope.view(),
                                  st.pos.view(), RopeOptions{});
  else if (c.step_rope == RopeMode::llama31)
    reference::apply_llama31_rope_pos_ids(in.q.view(), st.new_k.view(), q_rope.view(),
                                          k_rope.view(), st.pos.view(), Llama31RopeOptions{});
  reference::append_paged_kv_cache(k_rope.view(), st.new_v.view(), st.batch_indices.view(),
                                   st.positions.view(), in.cache->host);
  reference::batch_decode(q_rope.view(), in.cache->host, out, lse);
}

AppendInputs make_append_inputs(const FuzzConfig& c) {
  AppendInputs a;
  std::vector<int64_t> after, append_ptr{0};
  for (size_t i = 0; i < c.kv_lens.size(); ++i) {
    after.push_back(c.kv_lens[i] + c.qo_lens[i]);
    append_ptr.push_back(append_ptr.back() + c.qo_lens[i]);
  }
  a.cache = std::make_unique<RandomPagedCache>(after, c.page_size, c.num_kv_heads, c.head_dim,
                                               c.kv_dtype, derive_seed(c.seed, 1), c.layout);
  if (is_fp8_dtype(c.kv_dtype)) a.cache->host.scale = {.k = c.k_scale, .v = c.v_scale};
  const int64_t nnz = append_ptr.back();
  a.new_k = HostTensor(c.dtype, {nnz, c.num_kv_heads, c.head_dim});
  a.new_v = HostTensor(c.dtype, {nnz, c.num_kv_heads, c.head_dim});
  a.new_k.fill_random(derive_seed(c.seed, 5));
  a.new_v.fill_random(derive_seed(c.seed, 6));
  const HostTensor ip = i32_tensor(append_ptr), lens = i32_tensor(after);
  BatchIndicesPositions bp = get_batch_indices_positions(ip.view(), lens.view(), nnz);
  a.batch_indices = std::move(bp.batch_indices);
  a.positions = std::move(bp.positions);
  return a;
}

CascadeInputs make_cascade_inputs(const FuzzConfig& c) {
  CascadeInputs ci;
  const int groups = c.batch() / c.share_group;
  std::vector<int64_t> storage(groups, int64_t{c.shared_pages} * c.page_size);
  storage.insert(storage.end(), c.kv_lens.begin(), c.kv_lens.end());
  ci.storage = std::make_unique<RandomPagedCache>(storage, c.page_size, c.num_kv_heads, c.head_dim,
                                                  c.kv_dtype, derive_seed(c.seed, 1), c.layout);
  if (is_fp8_dtype(c.kv_dtype)) ci.storage->host.scale = {.k = c.k_scale, .v = c.v_scale};
  const RandomPagedCache& st = *ci.storage;
  ci.indptr = {0};
  ci.qo_indptr = {0};
  ci.rows = {0};
  for (int i = 0; i < c.batch(); ++i) {
    const int g = i / c.share_group, own = groups + i;
    for (int32_t p = st.indptr[g]; p < st.indptr[g + 1]; ++p) ci.ids.push_back(st.idx[p]);
    for (int32_t p = st.indptr[own]; p < st.indptr[own + 1]; ++p) ci.ids.push_back(st.idx[p]);
    ci.indptr.push_back(static_cast<int32_t>(ci.ids.size()));
    ci.last.push_back(c.kv_lens[i] > 0 ? st.last[own] : c.shared_pages > 0 ? c.page_size : 0);
    const int64_t rows = c.qo_lens.empty() ? 1 : c.qo_lens[i];
    ci.rows.push_back(ci.rows.back() + rows);
    ci.qo_indptr.push_back(static_cast<int32_t>(ci.rows.back()));
  }
  ci.q = HostTensor(c.dtype, {ci.rows.back(), c.num_qo_heads(), c.head_dim});
  ci.q.fill_random(derive_seed(c.seed, 2));
  ci.host = st.host;
  ci.host.indptr = i32_view(ci.indptr);
  ci.host.indices = i32_view(ci.ids);
  ci.host.last_page_len = i32_view(ci.last);
  return ci;
}

void cascade_plain_reference(const FuzzConfig& c, const CascadeInputs& ci, const TensorView& out,
                             const TensorView& lse) {
  if (c.qo_lens.empty()) {
    reference::batch_decode(ci.q.view(), ci.host, out, lse);
  } else {
    AttentionOptions o;
    o.causal = c.causal;
    reference::batch_prefill_paged(ci.q.view(), i32_view(ci.qo_indptr), ci.host, out, lse, o);
  }
}

SparseInputs make_sparse_inputs(const FuzzConfig& c) {
  SparseInputs s;
  s.c = c;
  const int64_t M = c.qo_lens[0], N = c.kv_lens[0], Hq = c.num_qo_heads();
  s.q = HostTensor(c.dtype, {M, Hq, c.head_dim});
  s.k = HostTensor(c.kv_dtype, {N, c.num_kv_heads, c.head_dim});
  s.v = HostTensor(c.kv_dtype, {N, c.num_kv_heads, c.head_dim});
  s.q.fill_random(derive_seed(c.seed, 2));
  s.k.fill_random(derive_seed(c.seed, 8));
  s.v.fill_random(derive_seed(c.seed, 9));
  s.sinks = HostTensor(DType::f32, {Hq});
  s.sinks.fill_random(derive_seed(c.seed, 3), -1.0, 2.0);
  s.alibi = HostTensor(DType::f32, {Hq});
  for (int64_t h = 0; h < Hq; ++h) s.alibi.set(h, std::ldexp(1.0, -static_cast<int>(h % 8) - 1));
  SplitMix64 rng(derive_seed(c.seed, 10));
  const double keep = c.density_pct / 100.0;
  if (c.op == FuzzOp::kBlockSparse) {
    const int64_t MB = M / c.block_r, NB = N / c.block_c;
    s.indptr = {0};
    for (int64_t i = 0; i < MB; ++i) {
      for (int64_t j = 0; j < NB; ++j)
        if (rng.uniform() < keep) s.indices.push_back(static_cast<int32_t>(j));
      s.indptr.push_back(static_cast<int32_t>(s.indices.size()));
    }
    if (c.element_mask) {
      s.block_mask.resize(s.indices.size() * c.block_r * c.block_c);
      for (auto& b : s.block_mask) b = rng.uniform() < 0.7 ? 1 : 0;
    }
  } else {
    const int64_t MB = c.block_r, NB = c.block_c;
    for (int h = 0; h < c.num_kv_heads; ++h) {
      for (int32_t x : composition(rng, M, MB)) s.row_sz.push_back(x);
      for (int32_t x : composition(rng, N, NB)) s.col_sz.push_back(x);
    }
    s.mask_map.resize(static_cast<size_t>(c.num_kv_heads) * MB * NB);
    for (auto& b : s.mask_map) b = rng.uniform() < keep ? 1 : 0;
  }
  return s;
}

BlockSparseLayout SparseInputs::bsr_layout() const {
  BlockSparseLayout l;
  l.indptr = indptr.data();
  l.indices = indices.data();
  l.M = c.qo_lens[0];
  l.N = c.kv_lens[0];
  l.R = c.block_r;
  l.C = c.block_c;
  l.block_mask = c.element_mask ? block_mask.data() : nullptr;
  return l;
}

VariableBlockSparseLayout SparseInputs::variable_layout() const {
  VariableBlockSparseLayout l;
  l.block_mask_map = mask_map.data();
  l.block_row_sz = row_sz.data();
  l.block_col_sz = col_sz.data();
  l.num_kv_heads = c.num_kv_heads;
  l.MB = c.block_r;
  l.NB = c.block_c;
  l.M = c.qo_lens[0];
  l.N = c.kv_lens[0];
  return l;
}

BlockSparseOptions SparseInputs::options(std::vector<DeviceBuffer>* keep) const {
  BlockSparseOptions o;
  o.causal = c.causal;
  o.logits_soft_cap = c.variant.soft_cap;
  if (c.variant.sinks) o.sinks = keep ? to_gpu(sinks, *keep) : sinks.view();
  if (c.variant.alibi) o.alibi_slopes = keep ? to_gpu(alibi, *keep) : alibi.view();
  o.rope.mode = c.variant.rope;
  if (is_fp8_dtype(c.kv_dtype)) o.kv_scale = {.k = c.k_scale, .v = c.v_scale};
  return o;
}

MergeInputs make_merge_inputs(const FuzzConfig& c) {
  MergeInputs m;
  const int64_t n = c.qo_lens[0], S = c.kv_lens[0], H = c.num_kv_heads, D = c.head_dim;
  m.v = HostTensor(c.dtype, {n, S, H, D});
  m.s = HostTensor(DType::f32, {n, S, H});
  m.v.fill_random(derive_seed(c.seed, 2));
  m.s.fill_random(derive_seed(c.seed, 3), -4.0, 4.0);
  SplitMix64 rng(derive_seed(c.seed, 4));
  for (int64_t i = 0; i < m.s.numel(); ++i)
    if (rng.next() % 8 == 0) m.s.set(i, -std::numeric_limits<double>::infinity());
  return m;
}

void MergeInputs::split_pair(HostTensor& va, HostTensor& sa, HostTensor& vb, HostTensor& sb) const {
  const int64_t n = v.shape()[0], H = v.shape()[2], D = v.shape()[3];
  va = HostTensor(v.dtype(), {n, H, D});
  vb = HostTensor(v.dtype(), {n, H, D});
  sa = HostTensor(DType::f32, {n, H});
  sb = HostTensor(DType::f32, {n, H});
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < H * D; ++j) {
      va.set(i * H * D + j, v.get((i * 2 + 0) * H * D + j));
      vb.set(i * H * D + j, v.get((i * 2 + 1) * H * D + j));
    }
    for (int64_t j = 0; j < H; ++j) {
      sa.set(i * H + j, s.get((i * 2 + 0) * H + j));
      sb.set(i * H + j, s.get((i * 2 + 1) * H + j));
    }
  }
}

}  // namespace flashkv::cli
