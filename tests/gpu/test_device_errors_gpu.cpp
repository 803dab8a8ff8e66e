// Bad device-resident input to the KV-cache ops, RoPE and plain batch decode (device_errors.h):
// the kernel writes nothing for the bad token (the cache is bitwise what the reference gives for
// the valid tokens alone; a RoPE row keeps its old values, or its poison; the other decode
// requests are still right), check_device_errors() raises a message naming the op, the argument
// and the values, and the record is reset (a second check passes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "flashkv/decode.h"
#include "flashkv/device_errors.h"
#include "flashkv/kv_ops.h"
#include "flashkv/reference.h"
#include "flashkv/reference_kv_ops.h"
#include "gpu/append_case.h"
#include "gpu/decode_case.h"

namespace flashkv::test {
namespace {

class DeviceErrorsGpu : public GpuTest {};

// check_device_errors() throws a message containing every one of `parts`; a second check passes.
void expect_device_error(const std::vector<std::string>& parts, Stream s = nullptr) {
  const std::string msg = error_of([&] { check_device_errors(0, s); });
  for (const auto& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' in: " << msg;
  EXPECT_NO_THROW(check_device_errors(0, s)) << "the record was not reset";
}

// i32 entry i of a host tensor, and a copy with entry i set to x.
int64_t at(const HostTensor& t, int64_t i) { return static_cast<int64_t>(t.get(i)); }
HostTensor with_entry(const HostTensor& t, int64_t i, int64_t x) {
  HostTensor r = t;
  r.set(i, static_cast<double>(x));
  return r;
}
void upload(DeviceTensor& d, const HostTensor& h) { d.buf.copy_from_host(h.data(), h.nbytes()); }

// The reference applied to the tokens `keep` accepts only (original page table and values).
void reference_append_subset(const AppendInputs& in, const AppendCase& c,
                             const std::function<bool(int64_t)>& keep) {
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < in.nnz; ++t)
    if (keep(t)) rows.push_back(t);
  const int64_t n = static_cast<int64_t>(rows.size()), H = c.num_kv_heads, D = c.head_dim;
  HostTensor key(c.dtype, {n, H, D}), value(c.dtype, {n, H, D}), bi(DType::i32, {n}),
      pos(DType::i32, {n});
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = rows[r];
    bi.set(r, at(in.batch_indices, t));
    pos.set(r, at(in.positions, t));
    for (int64_t e = 0; e < H * D; ++e) {
      const int64_t src = (t * H + e / D) * (D + c.row_pad) + e % D;
      key.set(r * H * D + e, in.new_k.get(src));
      value.set(r * H * D + e, in.new_v.get(src));
    }
  }
  reference::append_paged_kv_cache(key.view(), value.view(), bi.view(), pos.view(),
                                   in.host_cache());
}

// One bad-input scenario: `mutate` corrupts the device inputs, `bad` says which tokens it makes
// invalid, `parts` are what the message must name.
struct BadAppend {
  const char* what;
  std::function<void(const AppendInputs&, AppendDevice&)> mutate;
  std::function<bool(int64_t)> bad;
  std::vector<std::string> parts;
};

void expect_bad_append(const AppendCase& c, AppendInputs& in, const BadAppend& b) {
  AppendDevice d = to_device(in, c);
  b.mutate(in, d);
  append_paged_kv_cache(d.key, d.value, d.batch_indices.view, d.positions.view, d.cache);
  synchronize();
  SCOPED_TRACE(b.what);
  expect_device_error(b.parts);
  reference_append_subset(in, c, [&](int64_t t) { return !b.bad(t); });
  const std::vector<HostTensor> got = cache_to_host(d, in);
  const std::vector<const HostTensor*> want = cache_storage(in);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(std::memcmp(got[i].data(), want[i]->data(), got[i].nbytes()), 0)
        << c.str() << ": a bad token was written, or a valid one was not (cache tensor " << i
        << ")";
  }
}

TEST_F(DeviceErrorsGpu, AppendBadInputWritesNothingForThatTokenAndRaises) {
  AppendCase c;
  c.old_lens = {3, 0, 30, 16};
  c.append_lens = {4, 20, 1, 5};
  c.num_kv_heads = 4;
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    c.layout = layout;
    c.interleaved = layout == KVLayout::HND;
    // Token 10 is row 6 of request 1 (position 6); token 24 is request 2's one new token.
    const std::vector<BadAppend> cases = {
        {"position one past kv_len",
         [](const AppendInputs& in, AppendDevice& d) {
           upload(d.positions, with_entry(in.positions, 10, 20));  // request 1 has kv_len 20
         },
         [](int64_t t) { return t == 10; },
         {"append_paged_kv_cache: positions[10] = 20 is outside request 1's KV length 20",
          "batch_indices[10] = 1", "not written"}},
        {"negative position",
         [](const AppendInputs& in, AppendDevice& d) {
           upload(d.positions, with_entry(in.positions, 24, -7));
         },
         [](int64_t t) { return t == 24; },
         {"positions[24] = -7 is negative"}},
        {"batch index past the batch",
         [](const AppendInputs& in, AppendDevice& d) {
           upload(d.batch_indices, with_entry(in.batch_indices, 0, 4));
         },
         [](int64_t t) { return t == 0; },
         {"batch_indices[0] = 4 is out of range: expected 0 <= index < 4"}},
        {"page id out of range",
         [](const AppendInputs& in, AppendDevice& d) {
           // Request 2's last page (its one new token, position 30, is on page 1 of it).
           const int64_t entry = at(in.indptr, 2) + 1;
           upload(d.indices, with_entry(in.indices, entry, in.num_pages));
         },
         [](int64_t t) { return t == 24; },
         {"paged_kv.indices[", "is out of range: expected 0 <= page < "}},
        {"last_page_len zero",
         [](const AppendInputs& in, AppendDevice& d) {
           upload(d.last_page_len, with_entry(in.last_page_len, 3, 0));
         },
         [](int64_t t) { return t >= 25; },  // request 3's rows
         {"paged_kv.last_page_len[3] = 0 is out of range"}},
    };
    for (const BadAppend& b : cases) {
      AppendInputs in = make_append_inputs(c);
      ASSERT_EQ(at(in.batch_indices, 10), 1);
      ASSERT_EQ(at(in.positions, 10), 6);
      ASSERT_EQ(at(in.batch_indices, 24), 2);
      expect_bad_append(c, in, b);
    }
  }
}

TEST_F(DeviceErrorsGpu, FirstErrorWinsUntilChecked) {
  AppendCase c;
  c.old_lens = {0};
  c.append_lens = {3};
  AppendInputs in = make_append_inputs(c);
  AppendDevice d = to_device(in, c);
  upload(d.positions, with_entry(in.positions, 1, 99));
  append_paged_kv_cache(d.key, d.value, d.batch_indices.view, d.positions.view, d.cache);
  upload(d.positions, with_entry(in.positions, 2, -1));
  append_paged_kv_cache(d.key, d.value, d.batch_indices.view, d.positions.view, d.cache);
  synchronize();
  expect_device_error({"positions[1] = 99"});
}

TEST_F(DeviceErrorsGpu, RopeBadPositionsAreNotRotated) {
  const int64_t nnz = 6, H = 4, D = 64;
  HostTensor q(DType::f16, {nnz, H, D}), k(DType::f16, {nnz, 2, D});
  q.fill_random(1);
  k.fill_random(2);
  HostTensor cache(DType::f32, {100, D});
  cache.fill_random(3);
  struct Bad {
    std::vector<int64_t> pos;
    int64_t bad_token;
    std::vector<std::string> parts;
  };
  const Bad cases[] = {
      {{0, 1, 2, -5, 4, 5}, 3, {"apply_rope_with_cos_sin_cache: positions[3] = -5 is negative"}},
      {{0, 1, 100, 3, 4, 5}, 2, {"positions[2] = 100 is out of range: expected < 100"}},
  };
  for (const Bad& b : cases) {
    for (bool in_place : {false, true}) {
      DeviceTensor dq = to_device(q), dk = to_device(k), dpos = to_device(make_i32(b.pos));
      DeviceTensor dcache = to_device(cache);
      DeviceTensor dqo = poisoned_like(q), dko = poisoned_like(k);
      const TensorView& qo = in_place ? dq.view : dqo.view;
      const TensorView& ko = in_place ? dk.view : dko.view;
      apply_rope_with_cos_sin_cache(dq.view, dk.view, qo, ko, dpos.view, dcache.view);
      synchronize();
      expect_device_error(b.parts);
      // The bad token's rows: unchanged in place, still poison out of place; the others rotated.
      HostTensor got_q(DType::f16, {nnz, H, D});
      to_host(in_place ? dq : dqo, got_q);
      const size_t row = H * D * sizeof(uint16_t);
      const auto* g = static_cast<const unsigned char*>(got_q.data()) + b.bad_token * row;
      if (in_place) {
        EXPECT_EQ(
            std::memcmp(g, static_cast<const unsigned char*>(q.data()) + b.bad_token * row, row),
            0);
      } else {
        for (size_t i = 0; i < row; ++i) ASSERT_EQ(g[i], 0xff) << "byte " << i << " written";
      }
      const int64_t valid = (b.bad_token + 1) % nnz;
      EXPECT_NE(std::memcmp(static_cast<const unsigned char*>(got_q.data()) + valid * row,
                            static_cast<const unsigned char*>(q.data()) + valid * row, row),
                0)
          << "a valid token was not rotated";
    }
  }
}

TEST_F(DeviceErrorsGpu, RopeIndptrThatMissesTokensIsReported) {
  HostTensor q(DType::bf16, {5, 2, 64}), k(DType::bf16, {5, 1, 64});
  q.fill_random(4);
  k.fill_random(5);
  DeviceTensor dq = to_device(q), dk = to_device(k), dqo = poisoned_like(q), dko = poisoned_like(k);
  // indptr ends at 3 but there are 5 rows: rows 3 and 4 belong to no request.
  DeviceTensor indptr = to_device(make_i32({0, 2, 3})), offsets = to_device(make_i32({10, 0}));
  apply_rope(dq.view, dk.view, dqo.view, dko.view, indptr.view, offsets.view);
  synchronize();
  expect_device_error({"apply_rope: indptr"});
  HostTensor got(DType::bf16, {5, 2, 64});
  to_host(dqo, got);
  for (int64_t i = 3 * 2 * 64; i < got.numel(); ++i) ASSERT_TRUE(std::isnan(got.get(i))) << i;
  for (int64_t i = 0; i < 3 * 2 * 64; ++i) ASSERT_FALSE(std::isnan(got.get(i))) << i;
}

TEST_F(DeviceErrorsGpu, BatchPositionsSeqLenShorterThanAppend) {
  const HostTensor indptr = make_i32({0, 2, 7, 8}), seq = make_i32({10, 2, 1});
  HostTensor bi(DType::i32, {8}), pos(DType::i32, {8});
  DeviceTensor d_indptr = to_device(indptr), d_seq = to_device(seq);
  DeviceTensor d_bi = poisoned_like(bi), d_pos = poisoned_like(pos);
  get_batch_indices_positions(d_indptr.view, d_seq.view, d_bi.view, d_pos.view);
  synchronize();
  expect_device_error(
      {"get_batch_indices_positions: seq_lens[1] = 2 is less than request 1's "
       "append length 5"});
  to_host(d_bi, bi);
  to_host(d_pos, pos);
  const std::vector<double> want_bi = {0, 0, -1, -1, -1, -1, -1, 2};
  const std::vector<double> want_pos = {8, 9, -1, -1, -1, -1, -1, 0};
  EXPECT_EQ(bi.to_doubles(), want_bi);
  EXPECT_EQ(pos.to_doubles(), want_pos);
}

// Plain BatchDecode::run over a device page table with one request's page id out of range
// (>= num_pages, or negative; plan() saw only the host indptr / last_page_len): the decode kernel
// records it, check_device_errors() names the op and the paged_kv.indices entry and resets the
// record, and every other request's output and LSE still match the reference. Both kernels.
TEST_F(DeviceErrorsGpu, DecodeRunReportsOutOfRangePageIds) {
  const int Hq = 32, Hkv = 8, D = 128, page = 16;
  const DType dt = DType::f16;
  const std::vector<int64_t> lens = {300, 3, 1000, 0, 17};
  const int64_t B = static_cast<int64_t>(lens.size());
  PagedCacheHost cache = make_paged_cache(lens, page, Hkv, D, KVLayout::NHD, dt, 21);
  DeviceCache dc = to_device(cache);
  HostTensor q(dt, {B, Hq, D});
  q.fill_random(22);
  const DeviceTensor dq = to_device(q);
  HostTensor ref(DType::f32, {B, Hq, D}), ref_lowp(dt, {B, Hq, D}), ref_lse(DType::f32, {B, Hq});
  reference::batch_decode(q.view(), cache.cache, ref.view(), ref_lse.view());
  for (int64_t i = 0; i < ref.numel(); ++i) ref_lowp.set(i, ref.get(i));
  const auto ref_d = ref.to_doubles(), ref_lowp_d = ref_lowp.to_doubles(),
             ref_lse_d = ref_lse.to_doubles();

  BatchDecodeConfig cfg;
  cfg.max_batch = 8;
  cfg.num_qo_heads = Hq;
  cfg.head_dim = D;
  DeviceBuffer ws(BatchDecode::workspace_bytes(cfg));
  BatchDecode dec(cfg, ws.data(), ws.size());
  const int64_t num_pages = cache.cache.num_pages();
  struct BadPage {
    int request;
    int64_t page;  // the request's page (entry indptr[request] + page of paged_kv.indices)
    int64_t id;
  };
  // Request 0's second page past the cache; request 2's last page (a partial one) negative.
  const BadPage bad_pages[] = {{0, 1, num_pages}, {2, (1000 + page - 1) / page - 1, -1}};
  EXPECT_NO_THROW(check_device_errors(0)) << "an earlier test left an error pending";
  // check_page_ids off (the default kernel): the bad pages still read as zeros, nothing else is
  // touched, and nothing is reported.
  for (bool checked : {true, false}) {
    for (DecodeBackend backend : {DecodeBackend::kTensorCores, DecodeBackend::kCudaCores}) {
      for (const BadPage& bad : bad_pages) {
        SCOPED_TRACE(::testing::Message()
                     << (backend == DecodeBackend::kTensorCores ? "tensor cores" : "CUDA cores")
                     << (checked ? ", checked" : ", unchecked") << ": request " << bad.request
                     << " page " << bad.page << " = " << bad.id);
        const int64_t entry = at(cache.indptr, bad.request) + bad.page;
        ASSERT_LT(entry, at(cache.indptr, bad.request + 1));
        upload(dc.indices, with_entry(cache.indices, entry, bad.id));
        DecodePlanOptions opts;
        opts.backend = backend;
        opts.check_page_ids = checked;
        dec.plan({.kv_indptr = cache.indptr.view().data_as<int32_t>(),
                  .kv_last_page_len = cache.last_page_len.view().data_as<int32_t>(),
                  .batch_size = static_cast<int>(B),
                  .page_size = page},
                 {.num_qo_heads = Hq,
                  .num_kv_heads = Hkv,
                  .head_dim = D,
                  .q_dtype = dt,
                  .kv_dtype = dt,
                  .o_dtype = dt},
                 opts);
        EXPECT_EQ(dec.plan_info().tensor_cores, backend == DecodeBackend::kTensorCores);
        HostTensor got(dt, {B, Hq, D}), got_lse(DType::f32, {B, Hq});
        DeviceTensor dout = poisoned_like(got), dlse = poisoned_like(got_lse);
        dec.run(dq.view, dc.cache, dout.view, dlse.view);
        synchronize();
        if (checked) {
          // The entry, its value and its request (the KV position depends on where the item
          // starts).
          expect_device_error(
              {"BatchDecode::run",
               "paged_kv.indices[" + std::to_string(entry) + "] = " + std::to_string(bad.id),
               "of request " + std::to_string(bad.request)});
        } else {
          EXPECT_NO_THROW(check_device_errors(0));
        }
        upload(dc.indices, cache.indices);  // valid again for the next case
        to_host(dout, got);
        to_host(dlse, got_lse);
        const auto got_d = got.to_doubles(), lse_d = got_lse.to_doubles();
        const std::vector<ToleranceCheck> out_checks =
            check_tolerance_per_request(got_d, ref_d, ref_lowp_d, B, tolerance_floor(dt));
        const std::vector<double> lse_errs = rel_err_per_request(lse_d, ref_lse_d, B);
        for (int64_t r = 0; r < B; ++r) {
          if (r == bad.request) continue;  // its output is not specified
          EXPECT_TRUE(out_checks[r].pass) << "request " << r << ": " << out_checks[r].str();
          EXPECT_LE(lse_errs[r], 1e-4) << "request " << r << " (lse)";
        }
      }
    }
  }
}

TEST_F(DeviceErrorsGpu, CheckWithNothingPendingPasses) {
  EXPECT_NO_THROW(check_device_errors(0));
  EXPECT_NO_THROW(check_device_errors(0));
}

}  // namespace
}  // namespace flashkv::test
