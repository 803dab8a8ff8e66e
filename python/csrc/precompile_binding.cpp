// _C.precompile: flashkv::precompile (flashkv/jit.h) for `python -m flashkv.precompile`, so a
// wheel user, who has no C++ CLI, can fill the kernel cache before serving. The options arrive as
// keyword arguments with the CLI's spellings (dtypes by flashkv name); precompile_defaults() gives
// PrecompileOptions' defaults so Python keeps no copy of them.
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "binding_util.h"
#include "bindings.h"
#include "flashkv/jit.h"

namespace flashkv::python {
namespace {

using nb::arg;
using Names = std::vector<std::string>;
using Ints = std::vector<int>;

PrecompileOptions options(const std::string& arch, const Names& ops, const Names& dtypes,
                          const Names& kv_dtypes, const Ints& head_dims, const Ints& group_sizes,
                          const Ints& page_sizes, int jobs) {
  PrecompileOptions o;
  o.arch = arch;
  o.ops = ops;
  o.dtypes.clear();
  for (const auto& d : dtypes) o.dtypes.push_back(parse_dtype(d));
  for (const auto& d : kv_dtypes) o.kv_dtypes.push_back(parse_dtype(d));
  o.head_dims = head_dims;
  o.group_sizes = group_sizes;
  o.page_sizes = page_sizes;
  o.jobs = jobs;
  return o;
}

Names dtype_names(const std::vector<DType>& dtypes) {
  Names out;
  for (DType d : dtypes) out.push_back(dtype_name(d));
  return out;
}

}  // namespace

void bind_precompile(nb::module_& m) {
  m.def("precompile_ops", &precompile_ops);
  m.def("precompile_defaults", [] {
    const PrecompileOptions o;
    nb::dict d;
    d["arch"] = o.arch;
    d["ops"] = o.ops;
    d["dtypes"] = dtype_names(o.dtypes);
    d["kv_dtypes"] = dtype_names(o.kv_dtypes);
    d["head_dims"] = o.head_dims;
    d["group_sizes"] = o.group_sizes;
    d["page_sizes"] = o.page_sizes;
    return d;
  });
  m.def(
      "precompile_kernel_ids",
      [](const std::string& arch, const Names& ops, const Names& dtypes, const Names& kv_dtypes,
         const Ints& head_dims, const Ints& group_sizes, const Ints& page_sizes) {
        return precompile_kernel_ids(
            options(arch, ops, dtypes, kv_dtypes, head_dims, group_sizes, page_sizes, 1));
      },
      arg("arch"), arg("ops"), arg("dtypes"), arg("kv_dtypes"), arg("head_dims"),
      arg("group_sizes"), arg("page_sizes"));
  // Returns (kernel id, compiled (False: it was in the disk cache), ms) per kernel. progress, when
  // given, is called as each is done with the same triple and (done, total); it runs on
  // precompile's worker threads, which take the GIL for it.
  m.def(
      "precompile",
      [](const std::string& arch, const Names& ops, const Names& dtypes, const Names& kv_dtypes,
         const Ints& head_dims, const Ints& group_sizes, const Ints& page_sizes, int jobs,
         nb::object progress) {
        const PrecompileOptions o =
            options(arch, ops, dtypes, kv_dtypes, head_dims, group_sizes, page_sizes, jobs);
        PrecompileProgress report;
        if (!progress.is_none()) {
          report = [progress](const PrecompiledKernel& k, size_t done, size_t total) {
            nb::gil_scoped_acquire gil;
            progress(std::make_tuple(k.id, k.compiled, k.ms), done, total);
          };
        }
        std::vector<PrecompiledKernel> kernels;
        without_gil([&] { kernels = precompile(o, report); });
        std::vector<std::tuple<std::string, bool, double>> out;
        for (const auto& k : kernels) out.emplace_back(k.id, k.compiled, k.ms);
        return out;
      },
      arg("arch"), arg("ops"), arg("dtypes"), arg("kv_dtypes"), arg("head_dims"),
      arg("group_sizes"), arg("page_sizes"), arg("jobs"), arg("progress") = nb::none());
}

}  // namespace flashkv::python
