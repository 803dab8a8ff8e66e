// The flashkv CLI's subcommands. Each registers its options on the CLI11 app and runs.
#pragma once

#include <CLI/CLI.hpp>

namespace flashkv::cli {

void add_info_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_precompile_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_fuzz_command(CLI::App& app);

}  // namespace flashkv::cli
