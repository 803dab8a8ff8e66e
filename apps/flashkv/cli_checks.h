// CLI11 validators shared by the subcommands: each rejects a bad value at parse time, before any
// work starts, with a message that names what was expected (CLI11 prefixes the option's name).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace flashkv::cli {

// An integer in [lo, hi]: "expected an integer >= 1, got -5".
CLI::Validator int_in_range(long long lo, long long hi = (1LL << 62));
// One of `allowed`: "expected one of f16, bf16; got 'f64'".
CLI::Validator one_of(std::vector<std::string> allowed);
// A file this process can create or overwrite: its directory exists and is writable, and the path
// is not a directory. Checked when the option is parsed, so a long run cannot end on "cannot open".
CLI::Validator writable_file();
// "a, b, c"
std::string join(const std::vector<std::string>& items, const char* sep = ", ");

}  // namespace flashkv::cli
