#include "json_out.h"

#include <cstdio>
#include <ctime>
#include <fstream>

#include "flashkv/error.h"
#include "flashkv_build_commit.h"  // FLASHKV_BUILD_COMMIT (cmake/BuildCommit.cmake)

namespace flashkv::cli {

void write_json_if(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  std::ofstream out(path);
  check(static_cast<bool>(out), "--json: cannot open ", path, " for writing");
  out << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
}

std::string utc_now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string source_commit() {
  if (const char* c = std::getenv("FLASHKV_COMMIT"); c && *c) return c;
  if (sizeof(FLASHKV_BUILD_COMMIT) > 1) return FLASHKV_BUILD_COMMIT;  // the build's commit
  FILE* p = popen("git rev-parse --short HEAD 2>/dev/null", "r");
  if (!p) return "unknown";
  char buf[64] = {};
  const bool ok = std::fgets(buf, sizeof(buf), p) != nullptr;
  pclose(p);
  std::string s = ok ? buf : "unknown";
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s.empty() ? "unknown" : s;
}

}  // namespace flashkv::cli
