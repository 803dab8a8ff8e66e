"""Host time of the transformers adapter itself (flashkv.integrations.transformers), without the
attention: the wrappers' run / run_step and the append are replaced by stubs, plan() stays real
(on the CPU reference backend). A 32-layer random Llama (GQA 4, d128) generates 30 tokens for 16
requests of 40 tokens through transformers' continuous batching on the CPU.

    PYTHONPATH=python:build/python python bench/tf_adapter_overhead.py

Prints the adapter's host µs per reused-plan layer call and per plan (NOTES "transformers
integration"). Needs torch, transformers and psutil; no GPU."""
import torch

import flashkv.integrations.transformers as fkv_tf
from flashkv.integrations import model_families as mf


class _NoKernel:
    """A planned wrapper whose run() returns q: the adapter's own cost remains."""

    def __init__(self, wrapper):
        self.wrapper = wrapper

    def plan(self, *a, **k):
        return self.wrapper.plan(*a, **k)

    def run(self, q, *a, **k):
        return q

    def run_step(self, q, *a, **k):
        return q


def main():
    impl = fkv_tf.register("fkvo")
    make = impl._wrapper

    def stub_wrapper(gs, kind, device, layout="NHD"):
        w = make(gs, kind, device, layout)
        if not isinstance(w, _NoKernel):
            w = gs.wrappers[kind] = _NoKernel(w)
        return w

    impl._wrapper = stub_wrapper
    impl.backend.append = lambda *a, **k: None
    model = mf.build_model("llama", "paged|fkvo", torch.float32, "cpu", layers=32)
    mf.generate_cb(model, mf.prompts_for(256, [40] * 16, seed=1), 30)
    st = impl.stats
    print(f"{st.calls} layer calls, {st.plans} plans: {st.per_call_us():.0f} µs per reused-plan "
          f"call, {1e6 * st.plan_s / st.plans:.0f} µs per plan (paths {st.paths})")


if __name__ == "__main__":
    main()
