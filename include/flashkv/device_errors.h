// Errors that kernels find in device-resident input.
//
// Some arguments live in device memory and are only read by the kernel: the positions and batch
// indices of an append, a page table on the GPU, RoPE positions. Checking them on the host would
// cost a copy and a synchronization per call (and could not run inside a CUDA graph), so the
// kernels check them instead: a token whose input is bad is skipped (nothing is written for it,
// never out of bounds) and the first such error is kept in a small per-device record owned by
// flashkv. Nothing is silent: check_device_errors() reports it.
//
// Ops that record device errors: append_paged_kv_cache, get_batch_indices_positions, the RoPE
// ops (rope.h) and BatchDecode::run_step, on CUDA tensors; and BatchDecode::run / run_step's
// page ids where the plan asks (DecodePlanOptions::check_page_ids, or debug mode below; a page id
// outside the cache is read as zeros, so that request's output is not meaningful). The record is
// allocated (48 bytes, zeroed) on the first such call on a device; make that first call, or
// check_device_errors(), before capturing a CUDA graph (allocation is not allowed during capture).
//
// Debug mode: with the environment variable FLASHKV_CHECK_DEVICE_ERRORS=1 (read once), every
// such op calls check_device_errors() on its stream right after its launch (and BatchDecode checks
// its page ids), so the error is raised by the call that caused it (like CUDA_LAUNCH_BLOCKING; it
// synchronizes, so it is skipped while the stream is being captured into a graph).
#pragma once

#include "flashkv/runtime.h"

namespace flashkv {

// Synchronizes `stream`, reads the device's error record and, if a kernel recorded an error
// since the last check, resets the record and throws flashkv::Error naming the op, the argument
// and the values, e.g. "append_paged_kv_cache: positions[17] = 4096 is outside request 3's KV
// length 4095 (batch_indices[17] = 3); that token was not written". The record is per device,
// not per stream: the error may come from any stream's earlier launch (the first one wins).
// Cheap when no op has run on the device yet (nothing to read).
void check_device_errors(int device = 0, Stream stream = nullptr);

}  // namespace flashkv
