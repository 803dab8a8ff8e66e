#include "ops/jit/jit_util.h"

#include "flashkv/error.h"

namespace flashkv::ops {

runtime::CompileRequest make_request(const std::string& id, const std::string& header,
                                     std::vector<std::string> name_expressions,
                                     const std::string& extra_source) {
  runtime::CompileRequest r;
  r.key_name = id;
  r.source = "#include \"" + header + "\"\n" + extra_source;
  r.name_expressions = std::move(name_expressions);
  return r;
}

Device common_device(std::initializer_list<std::pair<const char*, const TensorView*>> tensors) {
  const char* first_name = nullptr;
  Device dev{};
  for (const auto& [name, t] : tensors) {
    if (!t->defined()) continue;
    if (!first_name) {
      first_name = name;
      dev = t->device();
    } else {
      if (!(t->device() == dev)) {
        fail(name, ": expected device ", dev.str(), " (the device of ", first_name, "), got ",
             t->device().str());
      }
    }
  }
  return dev;
}

}  // namespace flashkv::ops
