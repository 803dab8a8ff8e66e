// The per-device error record of kernels/common/device_error.cuh: allocation and the debug-mode
// check the ops run after their launches. The public check is flashkv::check_device_errors
// (include/flashkv/device_errors.h).
#pragma once

#include <string>

#include "common/device_error.cuh"
#include "flashkv/runtime.h"

namespace flashkv::runtime {

// The record of `device`, allocated and zeroed on first use (then never freed: kernels of any
// later launch may write it). Not during graph capture: the first call allocates.
DeviceErrorRecord* device_error_record(int device);

// The message check_device_errors throws for a record (code != 0).
std::string describe_device_error(const DeviceErrorRecord& rec);

// Whether FLASHKV_CHECK_DEVICE_ERRORS=1 (read once).
bool device_error_debug_mode();

// In debug mode and while `stream` is not capturing: check_device_errors(device, stream).
void check_device_errors_if_debug(int device, Stream stream);

}  // namespace flashkv::runtime
