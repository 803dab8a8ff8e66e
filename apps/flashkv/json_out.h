// Writing CLI results as JSON files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace flashkv::cli {

// Writes `j` (pretty-printed) to `path` when path is not empty; throws flashkv::Error on failure.
void write_json_if(const std::string& path, const nlohmann::json& j);
// "2026-11-29T10:00:00Z"
std::string utc_now_iso();
// Short commit of the source tree: $FLASHKV_COMMIT, else the commit CMake was configured from,
// else git at run time, else "unknown".
std::string source_commit();

}  // namespace flashkv::cli
