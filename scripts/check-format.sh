#!/usr/bin/env bash
# Checks that every C++/CUDA source in the repository is formatted by .clang-format (CI runs it);
# --fix formats them in place instead. The formatter is pinned to clang-format 14.0.6 (Debian 12's,
# and the PyPI wheel of that version): another version formats some constructs differently, so
# the check would flip with whatever a machine happens to have. The system's clang-format is used
# when it is that version, else the wheel is installed into $BUILD/format-venv (PyPI).
#   scripts/check-format.sh         exit 1 and list the files that differ
#   scripts/check-format.sh --fix   format them
set -euo pipefail
cd "$(dirname "$0")/.."
WANT=14.0.6
BUILD=${BUILD:-build}
CF=""
for c in clang-format clang-format-14; do
  if command -v "$c" >/dev/null 2>&1 && "$c" --version | grep -q "version $WANT"; then
    CF=$(command -v "$c")
    break
  fi
done
if [ -z "$CF" ]; then
  VENV="$BUILD/format-venv"
  [ -x "$VENV/bin/clang-format" ] || {
    "${PYTHON:-python3}" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "clang-format==$WANT"
  }
  CF="$VENV/bin/clang-format"
fi
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cuh' '*.cu')
if [ "${1:-}" = --fix ]; then
  "$CF" -i "${files[@]}"
  exit
fi
bad=()
for f in "${files[@]}"; do
  "$CF" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} file(s) differ from .clang-format ($CF $WANT):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "run scripts/check-format.sh --fix" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted ($WANT)"
