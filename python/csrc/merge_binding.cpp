// The merge of attention states from Python (flashkv/merge.h): ⊕ of two states, in place, and of
// many, with natural-log LSE (the wrappers convert FlashInfer's base 2).
#include "binding_util.h"
#include "bindings.h"
#include "flashkv/merge.h"

namespace flashkv::python {

using nb::arg;

void bind_merge(nb::module_& m) {
  m.def(
      "merge_state",
      [](const InArray& v_a, const InArray& s_a, const InArray& v_b, const InArray& s_b,
         const OutArray& v_out, const OutArray& s_out, uintptr_t stream) {
        const TensorView va = view_of(v_a, "v_a"), sa = view_of(s_a, "s_a"),
                         vb = view_of(v_b, "v_b"), sb = view_of(s_b, "s_b"),
                         vo = view_of(v_out, "v_out"), so = view_of(s_out, "s_out");
        without_gil([&] { merge_state(va, sa, vb, sb, vo, so, stream_of(stream)); });
      },
      arg("v_a"), arg("s_a"), arg("v_b"), arg("s_b"), arg("v_out"), arg("s_out"), arg("stream"));
  m.def(
      "merge_state_in_place",
      [](const OutArray& v, const OutArray& s, const InArray& v_other, const InArray& s_other,
         uintptr_t stream) {
        const TensorView vv = view_of(v, "v"), sv = view_of(s, "s"),
                         vo = view_of(v_other, "v_other"), so = view_of(s_other, "s_other");
        without_gil([&] { merge_state_in_place(vv, sv, vo, so, stream_of(stream)); });
      },
      arg("v"), arg("s"), arg("v_other"), arg("s_other"), arg("stream"));
  m.def(
      "merge_states",
      [](const InArray& v, const InArray& s, const OutArray& v_out, const OutArray& s_out,
         uintptr_t stream) {
        const TensorView vv = view_of(v, "v"), sv = view_of(s, "s"), vo = view_of(v_out, "v_out"),
                         so = view_of(s_out, "s_out");
        without_gil([&] { merge_states(vv, sv, vo, so, stream_of(stream)); });
      },
      arg("v"), arg("s"), arg("v_out"), arg("s_out"), arg("stream"));
}

}  // namespace flashkv::python
