#include "gpu/rope_case.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "flashkv/device_errors.h"
#include "flashkv/reference_kv_ops.h"
#include "flashkv/rope.h"

namespace flashkv::test {
namespace {

double unit_roundoff(DType t) {
  return t == DType::f16 ? 0x1p-11 : t == DType::bf16 ? 0x1p-8 : 0x1p-24;
}

// What the kernel adds on top of rounding for |x| <= 1: f32 cos/sin (angle rounded to f32, about
// 2.4e-7 absolute) and two f32 roundings, a few 1e-7; 2e-6 leaves room without hiding a wrong
// angle (a position off by one moves an element by up to freq ~ 1).
constexpr double kAbsFloor = 2e-6;

// A copy of `t` in f32 (exact for f16/bf16 values).
HostTensor to_f32(const HostTensor& t) {
  HostTensor r(DType::f32, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) r.set(i, t.get(i));
  return r;
}

// The inputs of a case, in one dtype, and the positions in whichever form the entry takes.
struct RopeInputs {
  HostTensor q, k;
  HostTensor indptr, offsets, pos_ids, cos_sin_cache;
};

bool by_indptr(RopeEntry e) { return e == RopeEntry::kRope || e == RopeEntry::kLlama31; }

RopeOptions llama_options(const RopeCase& c) {
  return {
      .rotary_dim = c.rotary_dim, .interleave = c.interleave, .rope_scale = 2.0, .rope_theta = 1e4};
}
Llama31RopeOptions llama31_options(const RopeCase& c) {
  Llama31RopeOptions o;
  o.rotary_dim = c.rotary_dim;
  o.interleave = c.interleave;
  return o;
}

RopeInputs make_inputs(const RopeCase& c) {
  int64_t nnz = 0;
  for (int64_t n : c.request_lens) nnz += n;
  RopeInputs in;
  in.q = HostTensor(c.dtype, {nnz, c.num_qo_heads, c.head_dim});
  in.k = HostTensor(c.dtype, {nnz, c.num_kv_heads, c.head_dim});
  if (in.q.numel() > 0) in.q.fill_random(c.seed * 3 + 1);
  if (in.k.numel() > 0) in.k.fill_random(c.seed * 3 + 2);
  SplitMix64 rng(c.seed * 3 + 3);
  auto draw = [&](int64_t n) {
    return static_cast<int64_t>(rng.next() % static_cast<uint64_t>(n));
  };
  std::vector<int64_t> ptr = {0}, offsets, pos;
  for (size_t i = 0; i < c.request_lens.size(); ++i) {
    const int64_t len = c.request_lens[i], room = c.max_position - len + 1;
    // The last request ends exactly at max_position - 1: the largest position is always tested.
    const int64_t off = i + 1 == c.request_lens.size() ? room - 1 : draw(room);
    ptr.push_back(ptr.back() + len);
    offsets.push_back(off);
    for (int64_t j = 0; j < len; ++j) pos.push_back(draw(c.max_position));
  }
  if (!pos.empty()) pos.back() = c.max_position - 1;
  in.indptr = make_i32(ptr);
  in.offsets = make_i32(offsets);
  in.pos_ids = make_i32(pos);
  if (c.entry == RopeEntry::kCosSinCache) {
    const int rd = c.rotary_dim == 0 ? c.head_dim : c.rotary_dim;
    const std::vector<double> f = rope_frequencies(rd, RopeOptions{.rope_theta = 1e4});
    in.cos_sin_cache = HostTensor(DType::f32, {c.max_position, rd});
    auto* row = static_cast<float*>(in.cos_sin_cache.data());
    for (int64_t p = 0; p < c.max_position; ++p, row += rd) {
      for (int i = 0; i < rd / 2; ++i) {
        row[i] = static_cast<float>(std::cos(p * f[i]));
        row[rd / 2 + i] = static_cast<float>(std::sin(p * f[i]));
      }
    }
  }
  return in;
}

// Runs the case's entry point on views q, k -> q_rope, k_rope (positions from `in`, which must
// be on the same device as q).
void run_entry(const RopeCase& c, const TensorView& q, const TensorView& k,
               const TensorView& q_rope, const TensorView& k_rope, const TensorView& indptr,
               const TensorView& offsets, const TensorView& pos_ids, const TensorView& cache,
               Stream stream) {
  switch (c.entry) {
    case RopeEntry::kRope:
      return apply_rope(q, k, q_rope, k_rope, indptr, offsets, llama_options(c), stream);
    case RopeEntry::kRopePosIds:
      return apply_rope_pos_ids(q, k, q_rope, k_rope, pos_ids, llama_options(c), stream);
    case RopeEntry::kLlama31:
      return apply_llama31_rope(q, k, q_rope, k_rope, indptr, offsets, llama31_options(c), stream);
    case RopeEntry::kLlama31PosIds:
      return apply_llama31_rope_pos_ids(q, k, q_rope, k_rope, pos_ids, llama31_options(c), stream);
    case RopeEntry::kCosSinCache:
      return apply_rope_with_cos_sin_cache(q, k, q_rope, k_rope, pos_ids, cache, !c.interleave,
                                           stream);
  }
}

// The reference on host tensors of one dtype, out of place.
void run_reference(const RopeCase& c, const RopeInputs& in, const HostTensor& q,
                   const HostTensor& k, HostTensor& q_out, HostTensor& k_out) {
  run_entry(c, q.view(), k.view(), q_out.view(), k_out.view(), in.indptr.view(), in.offsets.view(),
            in.pos_ids.view(), in.cos_sin_cache.view(), nullptr);
}

// A [n, H, D] tensor on the device with `pad` elements after each head row: the buffer holds
// [n, H, D + pad] (padding from `fill`: the input's values, or NaN for outputs).
struct PaddedDevice {
  DeviceTensor storage;
  TensorView view;
  HostTensor host_storage;  // [n, H, D + pad]
};

PaddedDevice padded_device(const HostTensor& t, int pad, bool poison) {
  const auto& s = t.shape();
  PaddedDevice d;
  d.host_storage = HostTensor(t.dtype(), {s[0], s[1], s[2] + pad});
  if (poison) {
    d.host_storage.fill_poison();
  } else {
    if (d.host_storage.numel() > 0) d.host_storage.fill_random(99);
    for (int64_t r = 0; r < s[0] * s[1]; ++r)
      for (int64_t e = 0; e < s[2]; ++e)
        d.host_storage.set(r * (s[2] + pad) + e, t.get(r * s[2] + e));
  }
  d.storage = to_device(d.host_storage);
  d.view = TensorView(d.storage.view.data(), t.dtype(), {s[0], s[1], s[2]},
                      {s[1] * (s[2] + pad), s[2] + pad, 1}, Device::cuda(0));
  return d;
}

// Copies the device tensor back; returns the [n, H, D] part, and whether the padding is all NaN.
HostTensor padded_to_host(PaddedDevice& d, const std::vector<int64_t>& shape, int pad,
                          bool* padding_nan) {
  to_host(d.storage, d.host_storage);
  HostTensor out(d.host_storage.dtype(), shape);
  *padding_nan = true;
  for (int64_t r = 0; r < shape[0] * shape[1]; ++r) {
    for (int64_t e = 0; e < shape[2] + pad; ++e) {
      const double x = d.host_storage.get(r * (shape[2] + pad) + e);
      if (e < shape[2])
        out.set(r * shape[2] + e, x);
      else if (!std::isnan(x))
        *padding_nan = false;
    }
  }
  return out;
}

}  // namespace

const char* rope_entry_name(RopeEntry e) {
  switch (e) {
    case RopeEntry::kRope:
      return "apply_rope";
    case RopeEntry::kRopePosIds:
      return "apply_rope_pos_ids";
    case RopeEntry::kLlama31:
      return "apply_llama31_rope";
    case RopeEntry::kLlama31PosIds:
      return "apply_llama31_rope_pos_ids";
    case RopeEntry::kCosSinCache:
      return "apply_rope_with_cos_sin_cache";
  }
  return "?";
}

std::string RopeCase::str() const {
  std::ostringstream os;
  int64_t nnz = 0;
  for (int64_t n : request_lens) nnz += n;
  os << rope_entry_name(entry) << " " << dtype_name(dtype) << " H" << num_qo_heads << "/"
     << num_kv_heads << " D" << head_dim << " rotary " << (rotary_dim ? rotary_dim : head_dim)
     << (interleave ? " interleave" : " neox") << (in_place ? " in-place" : " out-of-place")
     << " nnz " << nnz << " max_position " << max_position << " pad " << head_pad << " seed "
     << seed;
  return os.str();
}

std::string ElementwiseCheck::str() const {
  std::ostringstream os;
  os << failures << "/" << count << " elements out of bound (" << nan << " NaN), max |err| "
     << max_err << ", max err/bound " << max_err_ratio;
  if (!first_failure.empty()) os << "; first: " << first_failure;
  return os.str();
}

ElementwiseCheck check_elementwise(const std::vector<double>& out, const std::vector<double>& ref,
                                   const std::vector<double>& ref_lowp, DType dtype) {
  ElementwiseCheck c;
  c.count = static_cast<int64_t>(out.size());
  const double u = unit_roundoff(dtype);
  for (size_t i = 0; i < out.size(); ++i) {
    const double r = ref[i], err = std::fabs(out[i] - r);
    const double bound =
        std::min(2 * std::fabs(ref_lowp[i] - r) + u * std::fabs(r), 1e-2 * std::fabs(r)) +
        kAbsFloor;
    if (std::isnan(out[i])) ++c.nan;
    if (!(err <= bound)) {  // NaN fails here
      if (c.failures++ == 0) {
        std::ostringstream os;
        os << "[" << i << "] got " << out[i] << ", ref " << r << ", bound " << bound;
        c.first_failure = os.str();
      }
    }
    if (err > c.max_err) c.max_err = err;
    if (err / bound > c.max_err_ratio) c.max_err_ratio = err / bound;
  }
  return c;
}

RopeOutcome run_rope_case(const RopeCase& c) {
  const RopeInputs in = make_inputs(c);
  const auto& qs = in.q.shape();
  const auto& ks = in.k.shape();
  // References: exact (f32 in and out: the f16/bf16 inputs are exact in f32) and in the dtype.
  const HostTensor q32 = to_f32(in.q), k32 = to_f32(in.k);
  HostTensor ref_q(DType::f32, qs), ref_k(DType::f32, ks), low_q(c.dtype, qs), low_k(c.dtype, ks);
  run_reference(c, in, q32, k32, ref_q, ref_k);
  run_reference(c, in, in.q, in.k, low_q, low_k);

  PaddedDevice dq = padded_device(in.q, c.head_pad, false);
  PaddedDevice dk = padded_device(in.k, c.head_pad, false);
  PaddedDevice dqo, dko;
  if (!c.in_place) {
    dqo = padded_device(in.q, c.head_pad, true);
    dko = padded_device(in.k, c.head_pad, true);
  }
  PaddedDevice& q_dst = c.in_place ? dq : dqo;
  PaddedDevice& k_dst = c.in_place ? dk : dko;
  const DeviceTensor d_indptr = to_device(in.indptr), d_offsets = to_device(in.offsets),
                     d_pos = to_device(in.pos_ids);
  DeviceTensor d_cache;
  if (c.entry == RopeEntry::kCosSinCache) d_cache = to_device(in.cos_sin_cache);
  Stream s = create_stream();
  run_entry(c, dq.view, dk.view, q_dst.view, k_dst.view, d_indptr.view, d_offsets.view, d_pos.view,
            d_cache.view, s);
  synchronize(s);
  check_device_errors(0, s);  // valid input: nothing recorded (throws otherwise)
  destroy_stream(s);

  RopeOutcome o;
  bool q_pad_nan = true, k_pad_nan = true;
  o.q_out = padded_to_host(q_dst, qs, c.head_pad, &q_pad_nan);
  o.k_out = padded_to_host(k_dst, ks, c.head_pad, &k_pad_nan);
  o.padding_untouched = c.in_place || c.head_pad == 0 || (q_pad_nan && k_pad_nan);
  o.q = check_elementwise(o.q_out.to_doubles(), ref_q.to_doubles(), low_q.to_doubles(), c.dtype);
  o.k = check_elementwise(o.k_out.to_doubles(), ref_k.to_doubles(), low_k.to_doubles(), c.dtype);
  return o;
}

void expect_rope_ok(const RopeCase& c, const RopeOutcome& o) {
  EXPECT_TRUE(o.q.pass()) << c.str() << ": q_rope " << o.q.str();
  EXPECT_TRUE(o.k.pass()) << c.str() << ": k_rope " << o.k.str();
  EXPECT_TRUE(o.padding_untouched) << c.str() << ": the kernel wrote the padding between rows";
}

}  // namespace flashkv::test
