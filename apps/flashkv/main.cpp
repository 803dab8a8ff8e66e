// flashkv: info, verify, precompile, bench.
#include <cstdio>

#include "commands.h"
#include "flashkv/error.h"

int main(int argc, char** argv) {
  CLI::App app{"flashkv: attention over paged KV caches for LLM serving"};
  app.require_subcommand(1);
  flashkv::cli::add_info_command(app);
  flashkv::cli::add_verify_command(app);
  flashkv::cli::add_precompile_command(app);
  flashkv::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const flashkv::Error& e) {
    std::fprintf(stderr, "flashkv: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
