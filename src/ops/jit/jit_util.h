// Small helpers the ops share to name and build JIT kernel specializations.
#pragma once

#include <string>
#include <vector>

#include "common/kernel_key.h"
#include "flashkv/dtype.h"
#include "flashkv/tensor.h"
#include "runtime/nvrtc_compiler.h"

namespace flashkv::ops {

// The device-side element type of a dtype (common/kernel_key.h).
using flashkv::device_type_name;

// A compile request whose source includes `header` (a path under kernels/) and instantiates
// the given name expressions.
runtime::CompileRequest make_request(const std::string& id, const std::string& header,
                                     std::vector<std::string> name_expressions,
                                     const std::string& extra_source = "");

// All tensors are on one CUDA device or all on the host; returns that device. `names` and
// `tensors` are parallel; undefined tensors are skipped.
Device common_device(std::initializer_list<std::pair<const char*, const TensorView*>> tensors);

}  // namespace flashkv::ops
