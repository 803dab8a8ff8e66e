// What the planned ops' bindings (decode, prefill, cascade) share: the structs every plan() takes
// (AttentionShape, PageTableNames), the batch size of an indptr array, and StructBinding, which
// binds a plain C++ struct's fields and its to_dict() from one list of fields.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "array_view.h"
#include "flashkv/paged_kv.h"

namespace flashkv::python {

// PageTableNames (flashkv/paged_kv.h) owning its strings, so a plan's messages can name the
// wrapper's arguments (FlashInfer's names) instead of the C++ API's.
struct PyPageTableNames {
  std::string qo_indptr = "qo_indptr", kv_indptr = "kv_indptr", kv_indices = "kv_indices",
              kv_last_page_len = "kv_last_page_len";
  PageTableNames view() const {
    return {qo_indptr.c_str(), kv_indptr.c_str(), kv_indices.c_str(), kv_last_page_len.c_str()};
  }
};

// The requests of an indptr array [batch + 1] (ValueError naming it otherwise).
int batch_of(const InArray& indptr, const char* name);

// A bound struct's fields: read-write (options) or read-only (plan statistics), each also an entry
// of to_dict(), so the attribute list and the dict the Python wrappers return cannot disagree.
template <class S>
class StructBinding {
 public:
  StructBinding(nb::handle scope, const char* name, const char* doc) : cls_(scope, name, doc) {
    cls_.def(nb::init<>());
  }

  template <class T>
  StructBinding& rw(const char* name, T S::*field) {
    cls_.def_rw(name, field);
    return entry(name, field);
  }
  template <class T>
  StructBinding& ro(const char* name, T S::*field) {
    cls_.def_ro(name, field);
    return entry(name, field);
  }
  // A field Python sees as another type (an enum as its string): get and set convert.
  template <class Get, class Set>
  StructBinding& rw_as(const char* name, Get get, Set set) {
    cls_.def_prop_rw(name, get, set);
    dict_.emplace_back(name, [get](const S& s) { return nb::cast(get(s)); });
    return *this;
  }

  // to_dict() from the fields bound so far.
  nb::class_<S>& finish() {
    auto fields = dict_;
    cls_.def("to_dict", [fields](const S& s) {
      nb::dict d;
      for (const auto& [name, get] : fields) d[name] = get(s);
      return d;
    });
    return cls_;
  }

 private:
  template <class T>
  StructBinding& entry(const char* name, T S::*field) {
    dict_.emplace_back(name, [field](const S& s) { return nb::cast(s.*field); });
    return *this;
  }

  nb::class_<S> cls_;
  std::vector<std::pair<const char*, std::function<nb::object(const S&)>>> dict_;
};

}  // namespace flashkv::python
