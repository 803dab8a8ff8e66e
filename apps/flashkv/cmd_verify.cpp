// flashkv verify: every available op on fresh random inputs vs the CPU reference (GPU present),
// or the CPU reference against itself through the ⊕ identity (no GPU), with a clear note.
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "flashkv/decode.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/merge.h"
#include "flashkv/prefill.h"
#include "flashkv/reference.h"
#include "flashkv/runtime.h"
#include "host_inputs.h"
#include "json_out.h"

namespace flashkv::cli {
namespace {

struct Check {
  std::string name;
  double err;
  double tol;
};

// Decode over a random paged cache: GPU vs reference (or reference vs ⊕ of halves on CPU).
Check verify_decode(DType dt, int Hq, int Hkv, int D, int page, bool gpu, uint64_t seed) {
  // Without a GPU this checks the reference against itself: keep it small (seconds, not minutes).
  const std::vector<int64_t> lens =
      gpu ? std::vector<int64_t>{0, 1, 37, 600, 3000} : std::vector<int64_t>{0, 1, 37, 300};
  const int64_t B = static_cast<int64_t>(lens.size());
  const RandomPagedCache cache(lens, page, Hkv, D, dt, seed);
  const std::vector<int32_t>&indptr = cache.indptr, &last = cache.last, &idx = cache.idx;
  const HostTensor &k = cache.k, &v = cache.v;
  const PagedKVCache& c = cache.host;
  HostTensor q(dt, {B, Hq, D});
  q.fill_random(seed + 3);
  HostTensor ref(DType::f32, {B, Hq, D});
  reference::batch_decode(q.view(), c, ref.view(), TensorView());
  HostTensor got(dt, {B, Hq, D});
  if (gpu) {
    std::vector<DeviceBuffer> keep;
    const PagedKVCache dc = cache.to_device(keep);
    const TensorView dq = to_gpu(q, keep);
    HostTensor poison(dt, {B, Hq, D});
    poison.fill_poison();
    const TensorView dout = to_gpu(poison, keep);
    BatchDecodeConfig cfg{static_cast<int>(B), Hq, D};
    DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
    BatchDecode dec(cfg, ws.data(), ws.size());
    dec.plan({.kv_indptr = indptr.data(),
              .kv_last_page_len = last.data(),
              .batch_size = static_cast<int>(B),
              .page_size = page},
             {.num_qo_heads = Hq,
              .num_kv_heads = Hkv,
              .head_dim = D,
              .q_dtype = dt,
              .kv_dtype = dt,
              .o_dtype = dt});
    dec.run(dq, dc, dout, TensorView());
    synchronize();
    keep.back().copy_to_host(got.data(), got.nbytes());
  } else {
    // A second code path of the reference: gather each request's KV into ragged contiguous
    // tensors and run ragged prefill with one query row per request.
    const int64_t total = indptr.back() > 0 ? [&] { int64_t t = 0; for (int64_t l : lens) t += l; return t; }() : 0;
    HostTensor kr(dt, {std::max<int64_t>(total, 1), Hkv, D}),
        vr(dt, {std::max<int64_t>(total, 1), Hkv, D});
    std::vector<int32_t> kv_ptr{0}, qo_ptr{0};
    int64_t row = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < lens[b]; ++t, ++row) {
        const int64_t pg = idx[indptr[b] + t / page], slot = t % page;
        for (int64_t e = 0; e < Hkv * D; ++e) {
          kr.set(row * Hkv * D + e, k.get((pg * page + slot) * Hkv * D + e));
          vr.set(row * Hkv * D + e, v.get((pg * page + slot) * Hkv * D + e));
        }
      }
      kv_ptr.push_back(static_cast<int32_t>(row));
      qo_ptr.push_back(static_cast<int32_t>(b + 1));
    }
    const TensorView krv = kr.view().slice0(0, total), vrv = vr.view().slice0(0, total);
    reference::batch_prefill_ragged(q.view(), TensorView(qo_ptr.data(), DType::i32, {B + 1}), krv,
                                    vrv, TensorView(kv_ptr.data(), DType::i32, {B + 1}), got.view(),
                                    TensorView());
  }
  const std::string name = std::string("decode ") + dtype_name(dt) + " H" + std::to_string(Hq) +
                           "/" + std::to_string(Hkv) + " D" + std::to_string(D) + " page " +
                           std::to_string(page);
  return {name, relative_error(got.to_doubles(), ref.to_doubles()), dt == DType::f16 ? 2e-3 : 1e-2};
}

Check verify_merge(DType dt, bool gpu, uint64_t seed) {
  const int64_t n = 300, S = 5, H = 8, D = 128;
  HostTensor v(dt, {n, S, H, D}), s(DType::f32, {n, S, H});
  v.fill_random(seed);
  s.fill_random(seed + 1, -4, 4);
  HostTensor ref(dt, {n, H, D}), ref_s(DType::f32, {n, H}), got(dt, {n, H, D}),
      got_s(DType::f32, {n, H});
  reference::merge_states(v.view(), s.view(), ref.view(), ref_s.view());
  if (gpu) {
    std::vector<DeviceBuffer> keep;
    const TensorView dv = to_gpu(v, keep), ds = to_gpu(s, keep);
    const TensorView dvo = to_gpu(got, keep);
    const TensorView dso = to_gpu(got_s, keep);
    merge_states(dv, ds, dvo, dso);
    synchronize();
    keep[2].copy_to_host(got.data(), got.nbytes());
  } else {
    // ⊕ is associative: folding the S states pairwise with merge_state equals merge_states.
    HostTensor acc(DType::f32, {n, H, D}), acc_s(DType::f32, {n, H}), part(DType::f32, {n, H, D}),
        part_s(DType::f32, {n, H});
    acc_s.fill(-std::numeric_limits<double>::infinity());
    acc.fill(0);
    for (int64_t k = 0; k < S; ++k) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < H * D; ++j) part.set(i * H * D + j, v.get((i * S + k) * H * D + j));
        for (int64_t j = 0; j < H; ++j) part_s.set(i * H + j, s.get((i * S + k) * H + j));
      }
      reference::merge_state(acc.view(), acc_s.view(), part.view(), part_s.view(), acc.view(),
                             acc_s.view());
    }
    for (int64_t i = 0; i < got.numel(); ++i) got.set(i, acc.get(i));
  }
  return {std::string("merge_states ") + dtype_name(dt),
          relative_error(got.to_doubles(), ref.to_doubles()), dt == DType::f16 ? 2e-3 : 1e-2};
}

// Batch prefill (causal append + non-causal, ragged queries over a paged cache): GPU vs
// reference; without a GPU the paged reference vs the ragged reference on the same KV.
Check verify_prefill(DType dt, int Hq, int Hkv, int D, int page, bool causal, bool gpu,
                     uint64_t seed) {
  const std::vector<int64_t> qo =
      gpu ? std::vector<int64_t>{0, 1, 17, 300, 113} : std::vector<int64_t>{0, 1, 17, 40};
  const std::vector<int64_t> kvl =
      gpu ? std::vector<int64_t>{5, 1, 600, 300, 1023} : std::vector<int64_t>{5, 1, 60, 40};
  const int64_t B = static_cast<int64_t>(qo.size());
  std::vector<int32_t> qo_ptr{0}, tok_ptr{0};
  for (int64_t b = 0; b < B; ++b) {
    qo_ptr.push_back(static_cast<int32_t>(qo_ptr.back() + qo[b]));
    tok_ptr.push_back(static_cast<int32_t>(tok_ptr.back() + kvl[b]));
  }
  const RandomPagedCache cache(kvl, page, Hkv, D, dt, seed);
  const std::vector<int32_t>&kv_ptr = cache.indptr, &last = cache.last, &idx = cache.idx;
  const HostTensor &k = cache.k, &v = cache.v;
  const PagedKVCache& c = cache.host;
  const int64_t nq = qo_ptr.back(), ntok = tok_ptr.back();
  HostTensor q(dt, {nq, Hq, D});
  q.fill_random(seed + 3);
  AttentionOptions ao;
  ao.causal = causal;
  HostTensor ref(DType::f32, {nq, Hq, D});
  reference::batch_prefill_paged(q.view(), TensorView(qo_ptr.data(), DType::i32, {B + 1}), c,
                                 ref.view(), TensorView(), ao);
  HostTensor got(dt, {nq, Hq, D});
  if (gpu) {
    std::vector<DeviceBuffer> keep;
    const PagedKVCache dc = cache.to_device(keep);
    const TensorView dq = to_gpu(q, keep);
    HostTensor poison(dt, {nq, Hq, D});
    poison.fill_poison();
    const TensorView dout = to_gpu(poison, keep);
    BatchPrefillConfig cfg;
    cfg.max_batch = static_cast<int>(B);
    cfg.max_qo_tokens = nq;
    cfg.num_qo_heads = Hq;
    cfg.head_dim = D;
    DeviceBuffer ws(BatchPrefillPaged::workspace_bytes(cfg));
    BatchPrefillPaged pf(cfg, ws.data(), ws.size());
    PrefillPlanOptions po;
    po.causal = causal;
    pf.plan({.qo_indptr = qo_ptr.data(),
             .kv_indptr = kv_ptr.data(),
             .kv_last_page_len = last.data(),
             .batch_size = static_cast<int>(B),
             .page_size = page},
            {.num_qo_heads = Hq,
             .num_kv_heads = Hkv,
             .head_dim = D,
             .q_dtype = dt,
             .kv_dtype = dt,
             .o_dtype = dt},
            po);
    pf.run(dq, dc, dout, TensorView());
    synchronize();
    keep.back().copy_to_host(got.data(), got.nbytes());
  } else {
    HostTensor kr(dt, {std::max<int64_t>(ntok, 1), Hkv, D}),
        vr(dt, {std::max<int64_t>(ntok, 1), Hkv, D});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < kvl[b]; ++t) {
        const int64_t pg = idx[kv_ptr[b] + t / page], row = tok_ptr[b] + t;
        for (int64_t e = 0; e < Hkv * D; ++e) {
          kr.set(row * Hkv * D + e, k.get((pg * page + t % page) * Hkv * D + e));
          vr.set(row * Hkv * D + e, v.get((pg * page + t % page) * Hkv * D + e));
        }
      }
    reference::batch_prefill_ragged(q.view(), TensorView(qo_ptr.data(), DType::i32, {B + 1}),
                                    kr.view().slice0(0, ntok), vr.view().slice0(0, ntok),
                                    TensorView(tok_ptr.data(), DType::i32, {B + 1}), got.view(),
                                    TensorView(), ao);
  }
  const std::string name = std::string("prefill ") + (causal ? "causal " : "") + dtype_name(dt) +
                           " H" + std::to_string(Hq) + "/" + std::to_string(Hkv) + " D" +
                           std::to_string(D) + " page " + std::to_string(page);
  return {name, relative_error(got.to_doubles(), ref.to_doubles()), dt == DType::f16 ? 2e-3 : 1e-2};
}

}  // namespace

void add_verify_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "verify", "run every available op on random inputs against the CPU reference");
  auto* json_path = new std::string;
  cmd->add_option("--json", *json_path, "write the checks as JSON")->check(writable_file());
  cmd->callback([json_path] {
    const bool gpu = cuda_available();
    if (!gpu) {
      std::printf(
          "No CUDA GPU (%s): NOTHING IS CHECKED AGAINST A GPU. This only runs the CPU reference\n"
          "against itself (two code paths of it) at small size; run `flashkv verify` on a GPU\n"
          "machine to check the GPU kernels.\n",
          cuda_unavailable_reason().c_str());
    }
    std::vector<Check> checks;
    uint64_t seed = 1;
    for (DType dt : {DType::f16, DType::bf16}) {
      checks.push_back(verify_merge(dt, gpu, seed++));
      for (int D : {64, 128, 256})
        for (auto [hq, hkv] : {std::pair{32, 8}, {32, 32}, {32, 1}})
          for (int page : {1, 16})
            checks.push_back(verify_decode(dt, hq, hkv, D, page, gpu, seed++));
      for (int D : {64, 128, 256})
        for (auto [hq, hkv] : {std::pair{32, 8}, {8, 8}, {16, 1}})
          for (bool causal : {true, false})
            checks.push_back(verify_prefill(dt, hq, hkv, D, causal ? 16 : 5, causal, gpu, seed++));
    }
    int failed = 0;
    nlohmann::json j = nlohmann::json::array();
    for (const auto& c : checks) {
      const bool ok = c.err <= c.tol;
      failed += !ok;
      std::printf("%-4s %-40s rel_err %.2e (tol %.0e)\n", ok ? "ok" : "FAIL", c.name.c_str(), c.err,
                  c.tol);
      j.push_back({{"check", c.name}, {"rel_err", c.err}, {"tol", c.tol}, {"ok", ok}});
    }
    if (gpu)
      std::printf("%zu checks, %d failed (GPU vs CPU reference)\n", checks.size(), failed);
    else
      std::printf(
          "%zu checks, %d failed (CPU reference against itself; no GPU kernel was checked)\n",
          checks.size(), failed);
    write_json_if(*json_path, {{"gpu", gpu}, {"checks", j}});
    if (failed) throw flashkv::Error(std::to_string(failed) + " verification checks failed");
  });
}

}  // namespace flashkv::cli
