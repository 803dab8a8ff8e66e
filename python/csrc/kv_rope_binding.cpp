// The KV-cache and RoPE ops from Python (flashkv/kv_ops.h, flashkv/rope.h): the append into a
// paged cache, the batch indices and positions of an append, and RoPE in every form the wrappers
// offer (in place when q_rope is q and k_rope is k). Host arrays run the CPU reference.
#include <nanobind/stl/string.h>

#include <string>

#include "binding_util.h"
#include "bindings.h"
#include "flashkv/kv_ops.h"
#include "flashkv/rope.h"

namespace flashkv::python {

using nb::arg;

void bind_kv_rope(nb::module_& m) {
  m.def(
      "append_paged_kv_cache",
      [](const InArray& append_key, const InArray& append_value, const InArray& batch_indices,
         const InArray& positions, const OutArray& k, const OutArray& v, const std::string& layout,
         const InArray& indptr, const InArray& indices, const InArray& last_page_len,
         uintptr_t stream, float k_scale, float v_scale, const OptionalIn& k_scale_tensor,
         const OptionalIn& v_scale_tensor) {
        const TensorView ak = view_of(append_key, "append_key"),
                         av = view_of(append_value, "append_value"),
                         bi = view_of(batch_indices, "batch_indices"),
                         pos = view_of(positions, "positions");
        const PagedKVCache kv =
            paged_cache(k, v, layout, indptr, indices, last_page_len,
                        kv_scale_of(k_scale, v_scale, k_scale_tensor, v_scale_tensor));
        without_gil([&] { append_paged_kv_cache(ak, av, bi, pos, kv, stream_of(stream)); });
      },
      arg("append_key"), arg("append_value"), arg("batch_indices"), arg("positions"), arg("k"),
      arg("v"), arg("layout"), arg("indptr"), arg("indices"), arg("last_page_len"), arg("stream"),
      FLASHKV_KV_SCALE_ARGS);
  m.def(
      "get_batch_indices_positions",
      [](const InArray& append_indptr, const InArray& seq_lens, const OutArray& batch_indices,
         const OutArray& positions, uintptr_t stream) {
        const TensorView ai = view_of(append_indptr, "append_indptr"),
                         sl = view_of(seq_lens, "seq_lens"),
                         bi = view_of(batch_indices, "batch_indices"),
                         pos = view_of(positions, "positions");
        without_gil([&] { get_batch_indices_positions(ai, sl, bi, pos, stream_of(stream)); });
      },
      arg("append_indptr"), arg("seq_lens"), arg("batch_indices"), arg("positions"), arg("stream"));

  // RoPE: Llama (pos ids or indptr + offsets), Llama 3.1, a cos/sin cache.
  m.def(
      "apply_rope",
      [](const InArray& q, const InArray& k, const OutArray& q_rope, const OutArray& k_rope,
         const InArray& indptr, const InArray& offsets, int rotary_dim, bool interleave,
         double rope_scale, double rope_theta, uintptr_t stream) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), qr = view_of(q_rope, "q_rope"),
                         kr = view_of(k_rope, "k_rope"), ip = view_of(indptr, "indptr"),
                         off = view_of(offsets, "offsets");
        const RopeOptions o = llama_rope(rotary_dim, interleave, rope_scale, rope_theta);
        without_gil([&] { apply_rope(qv, kv, qr, kr, ip, off, o, stream_of(stream)); });
      },
      arg("q"), arg("k"), arg("q_rope"), arg("k_rope"), arg("indptr"), arg("offsets"),
      arg("rotary_dim"), arg("interleave"), arg("rope_scale"), arg("rope_theta"), arg("stream"));
  m.def(
      "apply_rope_pos_ids",
      [](const InArray& q, const InArray& k, const OutArray& q_rope, const OutArray& k_rope,
         const InArray& pos_ids, int rotary_dim, bool interleave, double rope_scale,
         double rope_theta, uintptr_t stream) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), qr = view_of(q_rope, "q_rope"),
                         kr = view_of(k_rope, "k_rope"), pos = view_of(pos_ids, "pos_ids");
        const RopeOptions o = llama_rope(rotary_dim, interleave, rope_scale, rope_theta);
        without_gil([&] { apply_rope_pos_ids(qv, kv, qr, kr, pos, o, stream_of(stream)); });
      },
      arg("q"), arg("k"), arg("q_rope"), arg("k_rope"), arg("pos_ids"), arg("rotary_dim"),
      arg("interleave"), arg("rope_scale"), arg("rope_theta"), arg("stream"));
  m.def(
      "apply_llama31_rope",
      [](const InArray& q, const InArray& k, const OutArray& q_rope, const OutArray& k_rope,
         const InArray& indptr, const InArray& offsets, int rotary_dim, bool interleave,
         double rope_scale, double rope_theta, double low_freq_factor, double high_freq_factor,
         double old_context_len, uintptr_t stream) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), qr = view_of(q_rope, "q_rope"),
                         kr = view_of(k_rope, "k_rope"), ip = view_of(indptr, "indptr"),
                         off = view_of(offsets, "offsets");
        const Llama31RopeOptions o =
            llama31_rope(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
                         high_freq_factor, old_context_len);
        without_gil([&] { apply_llama31_rope(qv, kv, qr, kr, ip, off, o, stream_of(stream)); });
      },
      arg("q"), arg("k"), arg("q_rope"), arg("k_rope"), arg("indptr"), arg("offsets"),
      arg("rotary_dim"), arg("interleave"), arg("rope_scale"), arg("rope_theta"),
      arg("low_freq_factor"), arg("high_freq_factor"), arg("old_context_len"), arg("stream"));
  m.def(
      "apply_llama31_rope_pos_ids",
      [](const InArray& q, const InArray& k, const OutArray& q_rope, const OutArray& k_rope,
         const InArray& pos_ids, int rotary_dim, bool interleave, double rope_scale,
         double rope_theta, double low_freq_factor, double high_freq_factor, double old_context_len,
         uintptr_t stream) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), qr = view_of(q_rope, "q_rope"),
                         kr = view_of(k_rope, "k_rope"), pos = view_of(pos_ids, "pos_ids");
        const Llama31RopeOptions o =
            llama31_rope(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
                         high_freq_factor, old_context_len);
        without_gil([&] { apply_llama31_rope_pos_ids(qv, kv, qr, kr, pos, o, stream_of(stream)); });
      },
      arg("q"), arg("k"), arg("q_rope"), arg("k_rope"), arg("pos_ids"), arg("rotary_dim"),
      arg("interleave"), arg("rope_scale"), arg("rope_theta"), arg("low_freq_factor"),
      arg("high_freq_factor"), arg("old_context_len"), arg("stream"));
  m.def(
      "apply_rope_with_cos_sin_cache",
      [](const InArray& q, const InArray& k, const OutArray& q_rope, const OutArray& k_rope,
         const InArray& positions, const InArray& cos_sin_cache, bool is_neox, uintptr_t stream) {
        const TensorView qv = view_of(q, "q"), kv = view_of(k, "k"), qr = view_of(q_rope, "q_rope"),
                         kr = view_of(k_rope, "k_rope"), pos = view_of(positions, "positions"),
                         cs = view_of(cos_sin_cache, "cos_sin_cache");
        without_gil([&] {
          apply_rope_with_cos_sin_cache(qv, kv, qr, kr, pos, cs, is_neox, stream_of(stream));
        });
      },
      arg("q"), arg("k"), arg("q_rope"), arg("k_rope"), arg("positions"), arg("cos_sin_cache"),
      arg("is_neox"), arg("stream"));
}

}  // namespace flashkv::python
