// flashkv: info, verify, precompile, bench, fuzz.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "flashkv/error.h"

int main(int argc, char** argv) {
  CLI::App app{"flashkv: attention over paged KV caches for LLM serving"};
  app.require_subcommand(1);
  flashkv::cli::add_info_command(app);
  flashkv::cli::add_verify_command(app);
  flashkv::cli::add_precompile_command(app);
  flashkv::cli::add_bench_command(app);
  flashkv::cli::add_fuzz_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // No subcommand but something else on the line (`flashkv --bogus`): CLI11 would only say
    // "A subcommand is required"; name what it did not understand.
    const std::vector<std::string> extra = app.remaining();
    if (app.get_subcommands().empty() && !extra.empty() && e.get_exit_code() != 0) {
      std::string names;
      for (const auto& x : extra) names += (names.empty() ? "" : " ") + x;
      std::fprintf(stderr,
                   "flashkv: unknown option or command: %s (expected a command: info, verify, "
                   "precompile, bench or fuzz; flashkv --help lists them)\n",
                   names.c_str());
      return static_cast<int>(CLI::ExitCodes::ExtrasError);
    }
    return app.exit(e);
  } catch (const flashkv::Error& e) {
    std::fprintf(stderr, "flashkv: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
