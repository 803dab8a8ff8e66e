// Block-sparse attention from Python (flashkv/block_sparse.h): _C.BlockSparseAttention (the GPU
// op), _C.reference_block_sparse_attention (its CPU reference) and _C.block_sparse_mask_bytes.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "binding_util.h"
#include "bindings.h"
#include "flashkv/block_sparse.h"
#include "flashkv/error.h"
#include "flashkv/reference_block_sparse.h"

namespace flashkv::python {
namespace {

using nb::arg;

// The layout's host arrays: indptr / indices int32, the element mask uint8 [nnz, R, C] (flashkv
// has no u8 DType: it crosses as a pointer, as the packed custom masks do).
BlockSparseLayout layout_of(const InArray& indptr, const InArray& indices, int64_t M, int64_t N,
                            int R, int C, const OptionalIn& block_mask) {
  BlockSparseLayout l;
  l.M = M;
  l.N = N;
  l.R = R;
  l.C = C;
  check(R >= 1 && C >= 1, "R, C: expected >= 1, got ", R, ", ", C);
  const int64_t rows = M / R;
  l.indptr = host_i32(indptr, "indptr", rows + 1);
  l.indices = host_i32(indices, "indices", l.indptr[rows] > 0 ? l.indptr[rows] : 0);
  if (block_mask) {
    const InArray& a = *block_mask;
    check(a.dtype() == nb::dtype<uint8_t>() || a.dtype() == nb::dtype<bool>(),
          "mask: expected dtype bool or uint8");
    check(a.device_type() == nb::device::cpu::value, "mask: expected a host array");
    int64_t expected = 1;
    for (int i = static_cast<int>(a.ndim()) - 1; i >= 0; --i) {
      check(a.shape(i) <= 1 || a.stride(i) == expected, "mask: expected a contiguous array");
      expected *= static_cast<int64_t>(a.shape(i));
    }
    const int64_t want = static_cast<int64_t>(l.indptr[rows]) * R * C;
    check(static_cast<int64_t>(a.size()) == want, "mask: expected [nnz, R, C] = ", want,
          " elements, got ", a.size());
    l.block_mask = static_cast<const uint8_t*>(a.data());
  }
  return l;
}

// pos: (alibi_slopes f32 [H_qo] or None, rope mode "none" / "llama", rope_scale, rope_theta).
struct PosArgs {
  OptionalIn alibi_slopes;
  std::string rope = "none";
  float rope_scale = 1.f, rope_theta = 1e4f;
};

BlockSparseOptions options_of(bool causal, float sm_scale, float logits_soft_cap,
                              const OptionalIn& sinks, const KVScale& scale,
                              const PosArgs& pos = {}) {
  BlockSparseOptions o;
  o.causal = causal;
  o.sm_scale = sm_scale;
  o.logits_soft_cap = logits_soft_cap;
  o.sinks = view_of(sinks, "sinks");
  o.kv_scale = scale;
  o.alibi_slopes = view_of(pos.alibi_slopes, "alibi_slopes");
  check(pos.rope == "none" || pos.rope == "llama", "rope: expected 'none' or 'llama', got '",
        pos.rope, "'");
  if (pos.rope == "llama") {
    o.rope.mode = RopeMode::llama;
    o.rope.rope_scale = pos.rope_scale;
    o.rope.rope_theta = pos.rope_theta;
  }
  return o;
}

BlockSparseConfig config_of(int64_t max_rows, int64_t max_block_rows, int64_t max_blocks,
                            int64_t max_mask_bytes, int num_qo_heads, int head_dim, int device) {
  BlockSparseConfig c;
  c.max_rows = max_rows;
  c.max_block_rows = max_block_rows;
  c.max_blocks = max_blocks;
  c.max_mask_bytes = max_mask_bytes;
  c.num_qo_heads = num_qo_heads;
  c.head_dim = head_dim;
  c.device = device;
  return c;
}

class PyBlockSparseAttention {
 public:
  PyBlockSparseAttention(OutArray workspace, int64_t max_rows, int64_t max_block_rows,
                         int64_t max_blocks, int64_t max_mask_bytes, int num_qo_heads, int head_dim,
                         int device)
      : ws_(std::move(workspace), device) {
    op_ = std::make_unique<BlockSparseAttention>(
        config_of(max_rows, max_block_rows, max_blocks, max_mask_bytes, num_qo_heads, head_dim,
                  device),
        ws_.data, ws_.bytes);
  }
  static size_t workspace_bytes(int64_t max_rows, int64_t max_block_rows, int64_t max_blocks,
                                int64_t max_mask_bytes, int num_qo_heads, int head_dim,
                                int device) {
    return BlockSparseAttention::workspace_bytes(config_of(
        max_rows, max_block_rows, max_blocks, max_mask_bytes, num_qo_heads, head_dim, device));
  }

  void plan(const InArray& indptr, const InArray& indices, int64_t M, int64_t N, int R, int C,
            const OptionalIn& mask, int num_qo_heads, int num_kv_heads, int head_dim,
            const std::string& q_dtype, const std::string& kv_dtype, bool causal, float sm_scale,
            float logits_soft_cap, const OptionalIn& sinks, const OptionalIn& alibi_slopes,
            const std::string& rope, float rope_scale, float rope_theta, uintptr_t stream) {
    const BlockSparseLayout l = layout_of(indptr, indices, M, N, R, C, mask);
    AttentionShape shape;
    shape.num_qo_heads = num_qo_heads;
    shape.num_kv_heads = num_kv_heads;
    shape.head_dim = head_dim;
    shape.q_dtype = shape.o_dtype = parse_dtype(q_dtype);
    shape.kv_dtype = parse_dtype(kv_dtype);
    sinks_ = sinks;  // the plan's variant points into them
    slopes_ = alibi_slopes;
    const BlockSparseOptions o = options_of(causal, sm_scale, logits_soft_cap, sinks_, {},
                                            {slopes_, rope, rope_scale, rope_theta});
    without_gil([&] { op_->plan(l, shape, o, stream_of(stream)); });
  }

  void run(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
           const LseArg& lse, uintptr_t stream, float k_scale, float v_scale,
           const OptionalIn& k_scale_tensor, const OptionalIn& v_scale_tensor) {
    const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), vv = view_of(v, "v"),
                     ov = view_of(out, "out"), lv = view_of(lse, "lse");
    const KVScale scale = kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor);
    without_gil([&] { op_->run(qv, kv, vv, ov, lv, scale, stream_of(stream)); });
  }

 private:
  Workspace ws_;  // declared first: destroyed after the op that uses it
  std::unique_ptr<BlockSparseAttention> op_;
  OptionalIn sinks_, slopes_;
};

// The per-head layout's host arrays: block_mask_map [H, MB, NB] (bool / uint8, contiguous),
// block_row_sz [H, MB] and block_col_sz [H, NB] (int32).
VariableBlockSparseLayout variable_layout_of(const InArray& map, const InArray& row_sz,
                                             const InArray& col_sz, int num_kv_heads, int64_t MB,
                                             int64_t NB, int64_t M, int64_t N) {
  check(num_kv_heads >= 1 && MB >= 0 && NB >= 0, "block_mask_map: expected [num_kv_heads >= 1, ",
        "MB, NB], got ", num_kv_heads, ", ", MB, ", ", NB);
  check(map.dtype() == nb::dtype<uint8_t>() || map.dtype() == nb::dtype<bool>(),
        "block_mask_map: expected dtype bool or uint8");
  check(map.device_type() == nb::device::cpu::value, "block_mask_map: expected a host array");
  check(static_cast<int64_t>(map.size()) == num_kv_heads * MB * NB,
        "block_mask_map: expected [num_kv_heads, MB, NB] = ", num_kv_heads * MB * NB,
        " elements, got ", map.size());
  int64_t expected = 1;
  for (int i = static_cast<int>(map.ndim()) - 1; i >= 0; --i) {
    check(map.shape(i) <= 1 || map.stride(i) == expected,
          "block_mask_map: expected a contiguous array");
    expected *= static_cast<int64_t>(map.shape(i));
  }
  VariableBlockSparseLayout l;
  l.block_mask_map = static_cast<const uint8_t*>(map.data());
  l.block_row_sz = host_i32(row_sz, "block_row_sz", num_kv_heads * MB);
  l.block_col_sz = host_i32(col_sz, "block_col_sz", num_kv_heads * NB);
  l.num_kv_heads = num_kv_heads;
  l.MB = MB;
  l.NB = NB;
  l.M = M;
  l.N = N;
  return l;
}

VariableBlockSparseConfig variable_config_of(int64_t max_rows, int64_t max_block_rows,
                                             int64_t max_kv_ids, int64_t max_mask_bytes,
                                             int num_qo_heads, int num_kv_heads, int head_dim,
                                             int device) {
  VariableBlockSparseConfig c;
  c.max_rows = max_rows;
  c.max_block_rows = max_block_rows;
  c.max_kv_ids = max_kv_ids;
  c.max_mask_bytes = max_mask_bytes;
  c.num_qo_heads = num_qo_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.device = device;
  return c;
}

class PyVariableBlockSparseAttention {
 public:
  PyVariableBlockSparseAttention(OutArray workspace, int64_t max_rows, int64_t max_block_rows,
                                 int64_t max_kv_ids, int64_t max_mask_bytes, int num_qo_heads,
                                 int num_kv_heads, int head_dim, int device)
      : ws_(std::move(workspace), device) {
    op_ = std::make_unique<VariableBlockSparseAttention>(
        variable_config_of(max_rows, max_block_rows, max_kv_ids, max_mask_bytes, num_qo_heads,
                           num_kv_heads, head_dim, device),
        ws_.data, ws_.bytes);
  }
  static size_t workspace_bytes(int64_t max_rows, int64_t max_block_rows, int64_t max_kv_ids,
                                int64_t max_mask_bytes, int num_qo_heads, int num_kv_heads,
                                int head_dim, int device) {
    return VariableBlockSparseAttention::workspace_bytes(
        variable_config_of(max_rows, max_block_rows, max_kv_ids, max_mask_bytes, num_qo_heads,
                           num_kv_heads, head_dim, device));
  }
  static size_t min_workspace_bytes(int64_t max_rows, int64_t max_block_rows, int64_t max_kv_ids,
                                    int64_t max_mask_bytes, int num_qo_heads, int num_kv_heads,
                                    int head_dim, int device) {
    return VariableBlockSparseAttention::min_workspace_bytes(
        variable_config_of(max_rows, max_block_rows, max_kv_ids, max_mask_bytes, num_qo_heads,
                           num_kv_heads, head_dim, device));
  }

  void plan(const InArray& map, const InArray& row_sz, const InArray& col_sz, int64_t MB,
            int64_t NB, int64_t M, int64_t N, int num_qo_heads, int num_kv_heads, int head_dim,
            const std::string& q_dtype, const std::string& kv_dtype, bool causal, float sm_scale,
            float logits_soft_cap, const OptionalIn& sinks, const OptionalIn& alibi_slopes,
            const std::string& rope, float rope_scale, float rope_theta, uintptr_t stream) {
    const VariableBlockSparseLayout l =
        variable_layout_of(map, row_sz, col_sz, num_kv_heads, MB, NB, M, N);
    AttentionShape shape;
    shape.num_qo_heads = num_qo_heads;
    shape.num_kv_heads = num_kv_heads;
    shape.head_dim = head_dim;
    shape.q_dtype = shape.o_dtype = parse_dtype(q_dtype);
    shape.kv_dtype = parse_dtype(kv_dtype);
    sinks_ = sinks;  // the plan's variant points into them
    slopes_ = alibi_slopes;
    const BlockSparseOptions o = options_of(causal, sm_scale, logits_soft_cap, sinks_, {},
                                            {slopes_, rope, rope_scale, rope_theta});
    without_gil([&] { op_->plan(l, shape, o, stream_of(stream)); });
  }

  void run(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
           const LseArg& lse, uintptr_t stream, float k_scale, float v_scale,
           const OptionalIn& k_scale_tensor, const OptionalIn& v_scale_tensor) {
    const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), vv = view_of(v, "v"),
                     ov = view_of(out, "out"), lv = view_of(lse, "lse");
    const KVScale scale = kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor);
    without_gil([&] { op_->run(qv, kv, vv, ov, lv, scale, stream_of(stream)); });
  }

 private:
  Workspace ws_;  // declared first: destroyed after the op that uses it
  std::unique_ptr<VariableBlockSparseAttention> op_;
  OptionalIn sinks_, slopes_;
};

void bind_variable_block_sparse(nb::module_& m) {
  nb::class_<PyVariableBlockSparseAttention>(m, "VariableBlockSparseAttention")
      .def(nb::init<OutArray, int64_t, int64_t, int64_t, int64_t, int, int, int, int>(),
           arg("workspace"), arg("max_rows"), arg("max_block_rows"), arg("max_kv_ids"),
           arg("max_mask_bytes"), arg("num_qo_heads"), arg("num_kv_heads"), arg("head_dim"),
           arg("device"))
      .def_static("workspace_bytes", &PyVariableBlockSparseAttention::workspace_bytes,
                  arg("max_rows"), arg("max_block_rows"), arg("max_kv_ids"), arg("max_mask_bytes"),
                  arg("num_qo_heads"), arg("num_kv_heads"), arg("head_dim"), arg("device"))
      .def_static("min_workspace_bytes", &PyVariableBlockSparseAttention::min_workspace_bytes,
                  arg("max_rows"), arg("max_block_rows"), arg("max_kv_ids"), arg("max_mask_bytes"),
                  arg("num_qo_heads"), arg("num_kv_heads"), arg("head_dim"), arg("device"))
      .def("plan", &PyVariableBlockSparseAttention::plan, arg("block_mask_map"),
           arg("block_row_sz"), arg("block_col_sz"), arg("MB"), arg("NB"), arg("M"), arg("N"),
           arg("num_qo_heads"), arg("num_kv_heads"), arg("head_dim"), arg("q_dtype"),
           arg("kv_dtype"), arg("causal"), arg("sm_scale"), arg("logits_soft_cap"),
           arg("sinks").none(), arg("alibi_slopes").none(), arg("rope"), arg("rope_scale"),
           arg("rope_theta"), arg("stream"))
      .def("run", &PyVariableBlockSparseAttention::run, arg("q"), arg("k"), arg("v"), arg("out"),
           arg("lse").none(), arg("stream"), FLASHKV_KV_SCALE_ARGS);
  m.def(
      "variable_block_sparse_needs",
      [](const InArray& map, const InArray& row_sz, const InArray& col_sz, int num_kv_heads,
         int64_t MB, int64_t NB, int64_t M, int64_t N, bool causal) {
        const VariableBlockSparseNeeds n = variable_block_sparse_needs(
            variable_layout_of(map, row_sz, col_sz, num_kv_heads, MB, NB, M, N), causal);
        return std::make_pair(n.kv_ids, n.mask_bytes);
      },
      arg("block_mask_map"), arg("block_row_sz"), arg("block_col_sz"), arg("num_kv_heads"),
      arg("MB"), arg("NB"), arg("M"), arg("N"), arg("causal"));
  m.def(
      "reference_variable_block_sparse_attention",
      [](const InArray& q, const InArray& k, const InArray& v, const InArray& map,
         const InArray& row_sz, const InArray& col_sz, int num_kv_heads, int64_t MB, int64_t NB,
         int64_t M, int64_t N, const OutArray& out, const LseArg& lse, bool causal, float sm_scale,
         float logits_soft_cap, const OptionalIn& sinks, const OptionalIn& alibi_slopes,
         const std::string& rope, float rope_scale, float rope_theta, float k_scale, float v_scale,
         const OptionalIn& k_scale_tensor, const OptionalIn& v_scale_tensor) {
        const VariableBlockSparseLayout l =
            variable_layout_of(map, row_sz, col_sz, num_kv_heads, MB, NB, M, N);
        const BlockSparseOptions o =
            options_of(causal, sm_scale, logits_soft_cap, sinks,
                       kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor),
                       {alibi_slopes, rope, rope_scale, rope_theta});
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), vv = view_of(v, "v"),
                         ov = view_of(out, "out"), lv = view_of(lse, "lse");
        without_gil([&] { reference::variable_block_sparse_attention(qv, kv, vv, l, ov, lv, o); });
      },
      arg("q"), arg("k"), arg("v"), arg("block_mask_map"), arg("block_row_sz"), arg("block_col_sz"),
      arg("num_kv_heads"), arg("MB"), arg("NB"), arg("M"), arg("N"), arg("out"), arg("lse").none(),
      arg("causal"), arg("sm_scale"), arg("logits_soft_cap"), arg("sinks").none(),
      arg("alibi_slopes").none(), arg("rope"), arg("rope_scale"), arg("rope_theta"),
      FLASHKV_KV_SCALE_ARGS);
}

}  // namespace

void bind_block_sparse(nb::module_& m) {
  nb::class_<PyBlockSparseAttention>(m, "BlockSparseAttention")
      .def(nb::init<OutArray, int64_t, int64_t, int64_t, int64_t, int, int, int>(),
           arg("workspace"), arg("max_rows"), arg("max_block_rows"), arg("max_blocks"),
           arg("max_mask_bytes"), arg("num_qo_heads"), arg("head_dim"), arg("device"))
      .def_static("workspace_bytes", &PyBlockSparseAttention::workspace_bytes, arg("max_rows"),
                  arg("max_block_rows"), arg("max_blocks"), arg("max_mask_bytes"),
                  arg("num_qo_heads"), arg("head_dim"), arg("device"))
      .def_static("min_workspace_bytes", &PyBlockSparseAttention::workspace_bytes, arg("max_rows"),
                  arg("max_block_rows"), arg("max_blocks"), arg("max_mask_bytes"),
                  arg("num_qo_heads"), arg("head_dim"), arg("device"))
      .def("plan", &PyBlockSparseAttention::plan, arg("indptr"), arg("indices"), arg("M"), arg("N"),
           arg("R"), arg("C"), arg("mask").none(), arg("num_qo_heads"), arg("num_kv_heads"),
           arg("head_dim"), arg("q_dtype"), arg("kv_dtype"), arg("causal"), arg("sm_scale"),
           arg("logits_soft_cap"), arg("sinks").none(), arg("alibi_slopes").none(), arg("rope"),
           arg("rope_scale"), arg("rope_theta"), arg("stream"))
      .def("run", &PyBlockSparseAttention::run, arg("q"), arg("k"), arg("v"), arg("out"),
           arg("lse").none(), arg("stream"), FLASHKV_KV_SCALE_ARGS);
  m.def(
      "block_sparse_mask_bytes",
      [](const InArray& indptr, const InArray& indices, int64_t M, int64_t N, int R, int C,
         const OptionalIn& mask, bool causal) {
        return block_sparse_mask_bytes(layout_of(indptr, indices, M, N, R, C, mask), causal);
      },
      arg("indptr"), arg("indices"), arg("M"), arg("N"), arg("R"), arg("C"), arg("mask").none(),
      arg("causal"));
  m.def(
      "reference_block_sparse_attention",
      [](const InArray& q, const InArray& k, const InArray& v, const InArray& indptr,
         const InArray& indices, int64_t M, int64_t N, int R, int C, const OptionalIn& mask,
         const OutArray& out, const LseArg& lse, bool causal, float sm_scale, float logits_soft_cap,
         const OptionalIn& sinks, const OptionalIn& alibi_slopes, const std::string& rope,
         float rope_scale, float rope_theta, float k_scale, float v_scale,
         const OptionalIn& k_scale_tensor, const OptionalIn& v_scale_tensor) {
        const BlockSparseLayout l = layout_of(indptr, indices, M, N, R, C, mask);
        const BlockSparseOptions o =
            options_of(causal, sm_scale, logits_soft_cap, sinks,
                       kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor),
                       {alibi_slopes, rope, rope_scale, rope_theta});
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), vv = view_of(v, "v"),
                         ov = view_of(out, "out"), lv = view_of(lse, "lse");
        without_gil([&] { reference::block_sparse_attention(qv, kv, vv, l, ov, lv, o); });
      },
      arg("q"), arg("k"), arg("v"), arg("indptr"), arg("indices"), arg("M"), arg("N"), arg("R"),
      arg("C"), arg("mask").none(), arg("out"), arg("lse").none(), arg("causal"), arg("sm_scale"),
      arg("logits_soft_cap"), arg("sinks").none(), arg("alibi_slopes").none(), arg("rope"),
      arg("rope_scale"), arg("rope_theta"), FLASHKV_KV_SCALE_ARGS);
  bind_variable_block_sparse(m);
}

}  // namespace flashkv::python
