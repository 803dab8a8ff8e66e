#include "cli_checks.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>

namespace flashkv::cli {
namespace fs = std::filesystem;

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? sep : "") + items[i];
  return s;
}

CLI::Validator int_in_range(long long lo, long long hi) {
  const std::string expected =
      hi >= (1LL << 62) ? "an integer >= " + std::to_string(lo)
                        : "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, expected](std::string& in) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(in.c_str(), &end, 10);
        if (in.empty() || end != in.c_str() + in.size() || errno == ERANGE || v < lo || v > hi)
          return "expected " + expected + ", got '" + in + "'";
        return "";
      },
      expected.substr(3));  // the --help column: "integer >= 1"
}

CLI::Validator one_of(std::vector<std::string> allowed) {
  const std::string list = join(allowed);
  return CLI::Validator(
      [allowed, list](std::string& in) -> std::string {
        if (std::find(allowed.begin(), allowed.end(), in) != allowed.end()) return "";
        return "expected one of " + list + "; got '" + in + "'";
      },
      "{" + join(allowed, ",") + "}");
}

CLI::Validator writable_file() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        if (in.empty()) return "expected a file path, got ''";
        const fs::path p(in);
        std::error_code ec;
        if (fs::is_directory(p, ec)) return "cannot write '" + in + "': it is a directory";
        const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
        if (!fs::exists(dir, ec))
          return "cannot write '" + in + "': directory '" + dir.string() + "' does not exist";
        if (!fs::is_directory(dir, ec))
          return "cannot write '" + in + "': '" + dir.string() + "' is not a directory";
        if (fs::exists(p, ec)) {
          if (access(in.c_str(), W_OK) != 0)
            return "cannot write '" + in + "': the file is not writable";
        } else if (access(dir.c_str(), W_OK) != 0) {
          return "cannot write '" + in + "': directory '" + dir.string() + "' is not writable";
        }
        return "";
      },
      "FILE");
}

}  // namespace flashkv::cli
