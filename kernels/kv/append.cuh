// Appending new tokens' keys and values into a paged KV cache (kv_ops.h), and FlashInfer's
// get_batch_indices_positions.
//
// append_kernel: the threads of one token validate its destination (batch index, position within
// the request's KV length, the page-table entries it reads), then copy its [H_kv, D] key and value
// rows to slot p % page_size of page indices[indptr[b] + p / page_size], V elements (16 bytes
// when the layout allows) per access. One address formula covers NHD, HND and interleaved k/v:
// page * page_stride + slot * token_stride + head * head_stride, with v at its own base pointer.
// A token with bad input is reported to the device error record and not written at all. Two
// tokens naming one slot are not detected here (that needs a sort); the CPU reference rejects them.
#pragma once

#include "common/device_error.cuh"
#include "kv/append_params.cuh"
#include "primitives/types.cuh"

namespace flashkv {

// The element offset of token t's slot in k/v, or -1 (reported by `reporter`) when its input is
// bad. Checks, in order, everything the address depends on: the batch index, the request's range
// of page-table entries, its last_page_len, the position against kv_len, and the page id.
__device__ __forceinline__ i64 append_slot_offset(const AppendParams& p, i64 t, bool reporter) {
  const int op = kDeviceOpAppendPagedKV;
  const long long b = p.batch_indices[t], pos = p.positions[t];
  if (b < 0 || b >= p.batch) {
    if (reporter) report_device_error(p.error, kDeviceErrorBatchIndex, op, t, b, p.batch, -1, b);
    return -1;
  }
  const long long first = p.kv_indptr[b], end = p.kv_indptr[b + 1];
  if (first < 0 || end < first || end > p.num_indices) {
    if (reporter) {
      report_device_error(p.error, kDeviceErrorPageRange, op, t, first, end, p.num_indices, b);
    }
    return -1;
  }
  long long kv_len = 0;
  if (end > first) {
    const long long last = p.kv_last_page_len[b];
    if (last < 1 || last > p.page_size) {
      if (reporter) {
        report_device_error(p.error, kDeviceErrorLastPageLen, op, t, last, p.page_size, b, b);
      }
      return -1;
    }
    kv_len = (end - first - 1) * p.page_size + last;
  }
  if (pos < 0 || pos >= kv_len) {
    if (reporter) report_device_error(p.error, kDeviceErrorPosition, op, t, pos, kv_len, -1, b);
    return -1;
  }
  const long long entry = first + pos / p.page_size;
  const long long page = p.kv_indices[entry];
  if (page < 0 || page >= p.num_pages) {
    if (reporter) {
      report_device_error(p.error, kDeviceErrorPageIndex, op, t, page, p.num_pages, entry, b);
    }
    return -1;
  }
  return page * p.page_stride + (pos % p.page_size) * p.token_stride;
}

template <class T, int V>
__device__ __forceinline__ void append_copy(const T* src, T* dst) {
  if constexpr (V * sizeof(T) == 16) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) dst[i] = src[i];
  }
}

// The rows of the token this thread serves, V elements at a time: write(src, dst, head, is_value)
// for each (head, unit) of its key and value rows (the threads of a token validate its
// destination first; a bad one writes nothing). Grid: ceil(nnz / tokens_per_cta) CTAs of
// tokens_per_cta * threads_per_token threads.
template <class S, class T, int V, class Write>
__device__ __forceinline__ void append_rows(const AppendParams& p, const Write& write) {
  const int tpt = p.threads_per_token;
  const int local = threadIdx.x % tpt;
  const i64 t = (i64)blockIdx.x * (blockDim.x / tpt) + threadIdx.x / tpt;
  if (t >= p.nnz) return;
  const i64 base = append_slot_offset(p, t, local == 0);
  if (base < 0) return;
  const S* key = static_cast<const S*>(p.key) + t * p.key_stride_n;
  const S* value = static_cast<const S*>(p.value) + t * p.value_stride_n;
  T* k = static_cast<T*>(p.k) + base;
  T* v = static_cast<T*>(p.v) + base;
  const int units = p.head_dim / V;
  for (int idx = local; idx < p.num_heads * units; idx += tpt) {
    const int h = idx / units, e = (idx % units) * V;
    write(key + h * p.key_stride_h + e, k + h * p.head_stride + e, h, false);
    write(value + h * p.value_stride_h + e, v + h * p.head_stride + e, h, true);
  }
}

// Rows in the cache's dtype, copied bit for bit.
template <class T, int V>
__global__ void __launch_bounds__(kAppendThreads)
    append_kernel(const __grid_constant__ AppendParams p) {
  append_rows<T, T, V>(p, [](const T* src, T* dst, int, bool) { append_copy<T, V>(src, dst); });
}

// V elements of S (V = 16 bytes' worth, or 1) divided by `scale` and rounded to fp8 F (round to
// nearest even, saturating, NaN stays NaN): the host's float_to_e4m3 / float_to_e5m2 of
// float(x) / scale, bit for bit (an IEEE f32 division, no reciprocal).
template <class S, class F, int V>
__device__ __forceinline__ void append_quantize(const S* src, F* dst, float scale) {
  float x[V];
  if constexpr (V == 1) {
    x[0] = to_float(src[0]);
    dst[0].bits = (unsigned char)quantize_fp8x2<F>(__fdiv_rn(x[0], scale), 0.f);
  } else {
    Vec16<S>::to_floats(*reinterpret_cast<const uint4*>(src), x);
    u32 w[V / 2];
#pragma unroll
    for (int i = 0; i < V / 2; ++i)
      w[i] = quantize_fp8x2<F>(__fdiv_rn(x[2 * i], scale), __fdiv_rn(x[2 * i + 1], scale));
    if constexpr (V == 8) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
    } else {
      static_assert(V == 4, "16 bytes of f32 or of a 16-bit type");
      *reinterpret_cast<u32*>(dst) = w[0] | (w[1] << 16);
    }
  }
}

// append_kernel into an fp8 cache F from f16 / bf16 / f32 rows S: quantized with the cache's
// scales (per tensor or per KV head).
template <class S, class F, int V>
__global__ void __launch_bounds__(kAppendThreads)
    append_quantize_kernel(const __grid_constant__ AppendParams p) {
  append_rows<S, F, V>(p, [&p](const S* src, F* dst, int head, bool is_value) {
    append_quantize<S, F, V>(src, dst,
                             is_value ? kv_scale_v(p.scale, head) : kv_scale_k(p.scale, head));
  });
}

// get_batch_indices_positions: token t of request i (row append_indptr[i] + j) gets batch index i
// and position seq_lens[i] - append_len(i) + j. One thread per token; the request is found by
// binary search. A token no request covers, or of a request whose seq_len is shorter than its
// append, is reported and left unwritten.
__global__ void batch_indices_positions_kernel(const int* __restrict__ append_indptr,
                                               const int* __restrict__ seq_lens, int batch,
                                               int* __restrict__ batch_indices,
                                               int* __restrict__ positions, i64 nnz,
                                               DeviceErrorRecord* error) {
  const int op = kDeviceOpBatchIndicesPositions;
  const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t == 0) {  // the ends of append_indptr, checked once
    if (append_indptr[0] != 0) {
      report_device_error(error, kDeviceErrorIndptr, op, -1, append_indptr[0], 0, 0);
    } else if (append_indptr[batch] != nnz) {
      report_device_error(error, kDeviceErrorIndptr, op, -1, append_indptr[batch], nnz, batch);
    }
  }
  if (t >= nnz) return;
  int lo = 0, hi = batch;  // the last i in [0, batch] with append_indptr[i] <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (append_indptr[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (lo >= batch || append_indptr[lo] > t || t >= append_indptr[lo + 1]) {
    report_device_error(error, kDeviceErrorIndptr, op, t, append_indptr[batch], nnz, batch);
    return;
  }
  const long long first = append_indptr[lo], append_len = append_indptr[lo + 1] - first;
  const long long seq_len = seq_lens[lo];
  if (seq_len < append_len) {
    if (t == first)
      report_device_error(error, kDeviceErrorSeqLen, op, t, seq_len, append_len, -1, lo);
    return;
  }
  batch_indices[t] = lo;
  positions[t] = (int)(seq_len - append_len + (t - first));
}

}  // namespace flashkv
