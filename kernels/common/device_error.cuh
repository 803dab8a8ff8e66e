// The device-side error record: how a kernel that finds bad input in device memory (a position
// past its request's pages, a page id out of range) reports it. Checking such input on the host
// would need a copy and a synchronization per call; instead the kernel skips the bad token (it
// writes nothing for it) and records the first error in a small library-owned struct that
// check_device_errors() (include/flashkv/device_errors.h) reads, resets and turns into an Error.
//
// Shared with the host (src/runtime/device_errors.cpp reads the same layout and names the codes
// and ops); includes nothing.
#pragma once

namespace flashkv {

// What went wrong. The meaning of the record's fields depends on the code (see each comment);
// src/runtime/device_errors.cpp turns them into the message.
enum DeviceErrorCode : int {
  kDeviceErrorNone = 0,
  // batch_indices[token] = value is outside [0, limit = batch).
  kDeviceErrorBatchIndex = 1,
  // positions[token] = value is outside [0, limit = kv_len(request)).
  kDeviceErrorPosition = 2,
  // paged_kv.indptr[request], [request + 1] = value, limit is not a range inside
  // paged_kv.indices (index = its size).
  kDeviceErrorPageRange = 3,
  // paged_kv.last_page_len[request] = value is outside [1, limit = page_size].
  kDeviceErrorLastPageLen = 4,
  // paged_kv.indices[index] = value is outside [0, limit = num_pages).
  kDeviceErrorPageIndex = 5,
  // RoPE: the position of token = value is negative or >= limit (the cos/sin cache rows; limit
  // < 0: no upper bound). request >= 0 when it came from indptr + offsets: offsets[request] +
  // index, index = the token's row within its request.
  kDeviceErrorRopePosition = 6,
  // An indptr (RoPE's indptr, append_indptr) is not non-decreasing from 0 to nnz: it places
  // `token` in no request (value = indptr[batch], limit = nnz); or, token = -1, an end is wrong:
  // indptr[index] = value where limit was expected (index 0: 0; index batch: nnz).
  kDeviceErrorIndptr = 7,
  // seq_lens[request] = value is less than the request's append length limit.
  kDeviceErrorSeqLen = 8,
};

// Which public op launched the kernel (the message names it, and the argument names it used).
enum DeviceErrorOp : int {
  kDeviceOpNone = 0,
  kDeviceOpAppendPagedKV = 1,
  kDeviceOpBatchIndicesPositions = 2,
  kDeviceOpApplyRope = 3,
  kDeviceOpApplyRopePosIds = 4,
  kDeviceOpApplyLlama31Rope = 5,
  kDeviceOpApplyLlama31RopePosIds = 6,
  kDeviceOpApplyRopeCosSinCache = 7,
  kDeviceOpDecodeStep = 8,  // BatchDecode::run_step (token = the request)
  // A page id behind a KV token the decode kernels read: BatchDecode::run, run_step (token = the
  // token's position in its request).
  kDeviceOpBatchDecode = 9,
  kDeviceOpBatchDecodeStep = 10,
};

// One per device, in device memory, zero while no error is pending. The first error wins: later
// ones (of the same launch or of later launches before the next check) are dropped.
struct DeviceErrorRecord {
  int code;           // DeviceErrorCode; 0: no error
  int op;             // DeviceErrorOp
  long long token;    // the row of the input that was skipped
  long long value;    // the bad value
  long long limit;    // the bound it broke
  long long index;    // the index of the bad entry in its tensor, where it is not `token`
  long long request;  // the request the token belongs to, or -1
};

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
// Records an error unless one is already pending. The code is claimed first (atomicCAS), so two
// threads never mix their fields; the fence orders the fields before the kernel's completion,
// which is what the host waits for before it reads them.
__device__ __forceinline__ void report_device_error(DeviceErrorRecord* rec, int code, int op,
                                                    long long token, long long value,
                                                    long long limit, long long index = -1,
                                                    long long request = -1) {
  if (rec == nullptr) return;
  if (atomicCAS(&rec->code, 0, code) != 0) return;
  rec->op = op;
  rec->token = token;
  rec->value = value;
  rec->limit = limit;
  rec->index = index;
  rec->request = request;
  __threadfence();
}
#endif

}  // namespace flashkv
