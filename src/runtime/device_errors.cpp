// The per-device error record (kernels/common/device_error.cuh): lazy allocation, the public
// check, and the messages. Messages live here, next to the codes, so a kernel only stores numbers
// and every op's errors read the same way.
#include "runtime/device_errors.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "flashkv/device_errors.h"
#include "flashkv/error.h"
#include "runtime/driver.h"
#include "runtime/launch.h"

namespace flashkv {
namespace runtime {
namespace {

struct RecordTable {
  std::mutex mu;
  std::vector<CUdeviceptr> records;  // by device; 0 until first use
};

// Never destroyed: a kernel still in flight at exit may write its record, and freeing device
// memory from a static destructor races the driver's own shutdown.
RecordTable& table() {
  static RecordTable& t = *new RecordTable;
  return t;
}

// The record of `device` if one was allocated, else 0.
CUdeviceptr existing_record(int device) {
  RecordTable& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return device >= 0 && device < static_cast<int>(t.records.size()) ? t.records[device] : 0;
}

const char* op_name(int op) {
  switch (op) {
    case kDeviceOpAppendPagedKV:
      return "append_paged_kv_cache";
    case kDeviceOpBatchIndicesPositions:
      return "get_batch_indices_positions";
    case kDeviceOpApplyRope:
      return "apply_rope";
    case kDeviceOpApplyRopePosIds:
      return "apply_rope_pos_ids";
    case kDeviceOpApplyLlama31Rope:
      return "apply_llama31_rope";
    case kDeviceOpApplyLlama31RopePosIds:
      return "apply_llama31_rope_pos_ids";
    case kDeviceOpApplyRopeCosSinCache:
      return "apply_rope_with_cos_sin_cache";
    case kDeviceOpDecodeStep:
    case kDeviceOpBatchDecodeStep:
      return "BatchDecode::run_step";
    case kDeviceOpBatchDecode:
      return "BatchDecode::run";
    default:
      return "a flashkv kernel";
  }
}

// The argument that held the positions of a RoPE op.
const char* position_name(int op) {
  return op == kDeviceOpApplyRopeCosSinCache ? "positions" : "pos_ids";
}

const char* indptr_name(int op) {
  return op == kDeviceOpBatchIndicesPositions ? "append_indptr" : "indptr";
}

// "token 17" or, for the fused decode step whose `token` is the request, "request 17's new token".
std::string subject(const DeviceErrorRecord& r) {
  return r.op == kDeviceOpDecodeStep ? detail::concat("request ", r.token, "'s new token")
                                     : detail::concat("token ", r.token);
}

std::string rope_position_message(const DeviceErrorRecord& r) {
  std::string where;
  if (r.op == kDeviceOpDecodeStep) {
    where = detail::concat("the RoPE position of ", subject(r), ", ", r.value, ",");
  } else if (r.request >= 0) {  // indptr + offsets
    where =
        detail::concat("the position of token ", r.token, " (row ", r.index, " of request ",
                       r.request, "), offsets[", r.request, "] + ", r.index, " = ", r.value, ",");
  } else {
    where = detail::concat(position_name(r.op), "[", r.token, "] = ", r.value);
  }
  const std::string why = r.value < 0
                              ? std::string(" is negative")
                              : detail::concat(" is out of range: expected < ", r.limit,
                                               " (cos_sin_cache.size(0), the positions it holds)");
  if (r.op == kDeviceOpDecodeStep) {
    return detail::concat(where, why, "; ", subject(r),
                          " was not appended and its q not rotated (its output is not meaningful)");
  }
  return detail::concat(where, why, "; ", subject(r), " was not rotated (nothing written for it)");
}

std::string message(const DeviceErrorRecord& r) {
  const std::string skipped = detail::concat("; ", subject(r), " was not written");
  switch (r.code) {
    case kDeviceErrorBatchIndex:
      return detail::concat("batch_indices[", r.token, "] = ", r.value,
                            " is out of range: expected 0 <= index < ", r.limit,
                            " (paged_kv batch)", skipped);
    case kDeviceErrorPosition:
      if (r.value < 0) {
        return detail::concat("positions[", r.token, "] = ", r.value,
                              " is negative (batch_indices[", r.token, "] = ", r.request, ")",
                              skipped);
      }
      return detail::concat("positions[", r.token, "] = ", r.value, " is outside request ",
                            r.request, "'s KV length ", r.limit, " (batch_indices[", r.token,
                            "] = ", r.request,
                            "); paged_kv must describe the cache after the append, new tokens "
                            "included",
                            skipped);
    case kDeviceErrorPageRange:
      return detail::concat("paged_kv.indptr[", r.request, "] = ", r.value, " and paged_kv.indptr[",
                            r.request + 1, "] = ", r.limit,
                            " are not a range of paged_kv.indices: expected 0 <= indptr[i] <= "
                            "indptr[i + 1] <= ",
                            r.index, " (its size)", skipped);
    case kDeviceErrorLastPageLen:
      return detail::concat("paged_kv.last_page_len[", r.request, "] = ", r.value,
                            " is out of range: expected 1 <= last_page_len <= ", r.limit,
                            " (page_size) for a request with pages", skipped);
    case kDeviceErrorPageIndex:
      if (r.op == kDeviceOpBatchDecode || r.op == kDeviceOpBatchDecodeStep) {
        return detail::concat("paged_kv.indices[", r.index, "] = ", r.value,
                              " is out of range: expected 0 <= page < ", r.limit,
                              " (num_pages) (KV position ", r.token, " of request ", r.request,
                              "); its keys and values were read as zeros, so request ", r.request,
                              "'s output and lse are not meaningful");
      }
      if (r.index < 0) {
        return detail::concat("the page of ", subject(r), ", ", r.value,
                              ", is out of range: expected 0 <= page < ", r.limit, " (num_pages)",
                              skipped);
      }
      return detail::concat("paged_kv.indices[", r.index, "] = ", r.value,
                            " is out of range: expected 0 <= page < ", r.limit, " (num_pages) (",
                            r.op == kDeviceOpDecodeStep
                                ? subject(r)
                                : detail::concat(subject(r), " of request ", r.request),
                            ")", skipped);
    case kDeviceErrorRopePosition:
      return rope_position_message(r);
    case kDeviceErrorIndptr: {
      const char* name = indptr_name(r.op);
      if (r.token < 0 && r.index == 0) {
        return detail::concat(name, "[0] = ", r.value, ": expected 0");
      }
      if (r.token < 0) {
        return detail::concat(name, "[", r.index, "] = ", r.value, ": expected nnz = ", r.limit,
                              " (the number of rows); rows no request covers were not written");
      }
      return detail::concat(
          name, " places token ", r.token,
          " in no request: expected non-decreasing values from 0 to nnz = ", r.limit, skipped);
    }
    case kDeviceErrorSeqLen:
      return detail::concat("seq_lens[", r.request, "] = ", r.value, " is less than request ",
                            r.request, "'s append length ", r.limit, " (append_indptr[",
                            r.request + 1, "] - append_indptr[", r.request,
                            "]): seq_lens are the lengths after the append; its rows (token ",
                            r.token, " first) were not written");
    default:
      return detail::concat("unknown device error code ", r.code, " (token ", r.token, ", value ",
                            r.value, ", limit ", r.limit, ")");
  }
}

}  // namespace

DeviceErrorRecord* device_error_record(int device) {
  ensure_context(device);
  RecordTable& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (static_cast<int>(t.records.size()) <= device) t.records.resize(device + 1, 0);
  CUdeviceptr& p = t.records[device];
  if (p == 0) {
    static_assert(sizeof(DeviceErrorRecord) % 4 == 0, "zeroed with cuMemsetD32");
    CUdeviceptr fresh = 0;
    check_cu(driver().cuMemAlloc(&fresh, sizeof(DeviceErrorRecord)),
             "cuMemAlloc(device error record)");
    check_cu(driver().cuMemsetD32(fresh, 0, sizeof(DeviceErrorRecord) / 4),
             "cuMemsetD32(device error record)");
    p = fresh;
  }
  return reinterpret_cast<DeviceErrorRecord*>(p);
}

std::string describe_device_error(const DeviceErrorRecord& rec) {
  return detail::concat(op_name(rec.op), ": ", message(rec));
}

bool device_error_debug_mode() {
  static const bool on = [] {
    const char* v = std::getenv("FLASHKV_CHECK_DEVICE_ERRORS");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

void check_device_errors_if_debug(int device, Stream stream) {
  if (device_error_debug_mode() && !stream_is_capturing(stream)) {
    flashkv::check_device_errors(device, stream);
  }
}

}  // namespace runtime

void check_device_errors(int device, Stream stream) {
  const CUdeviceptr p = runtime::existing_record(device);
  if (p == 0) return;  // no op that records errors has run on this device
  runtime::ensure_context(device);
  const runtime::Driver& d = runtime::driver();
  runtime::check_cu(d.cuStreamSynchronize(stream), "check_device_errors: cuStreamSynchronize");
  DeviceErrorRecord rec{};
  runtime::check_cu(d.cuMemcpyDtoH(&rec, p, sizeof(rec)), "check_device_errors: cuMemcpyDtoH");
  if (rec.code == kDeviceErrorNone) return;
  runtime::check_cu(d.cuMemsetD32(p, 0, sizeof(rec) / 4), "check_device_errors: cuMemsetD32");
  throw Error(runtime::describe_device_error(rec));
}

}  // namespace flashkv
