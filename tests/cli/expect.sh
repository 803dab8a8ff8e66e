#!/usr/bin/env bash
# expect.sh RC REGEX [--not REGEX2] -- COMMAND [ARGS...]
# Runs COMMAND with no GPU visible (CUDA_VISIBLE_DEVICES=""): the CLI tests check what a user
# sees on a machine without one, on every machine. Passes when the exit status is RC (0, or
# "nonzero") and the output (stdout and stderr together) matches the extended regex REGEX (and
# not REGEX2).
set -uo pipefail
want_rc=$1 regex=$2
shift 2
reject=""
if [ "${1:-}" = --not ]; then reject=$2; shift 2; fi
[ "${1:-}" = -- ] && shift
out=$(CUDA_VISIBLE_DEVICES="" "$@" 2>&1)
rc=$?
printf '$ %s\n%s\n(exit %d)\n' "$*" "$out" "$rc"
if [ "$want_rc" = nonzero ]; then
  [ "$rc" -ne 0 ] || { echo "FAIL: expected a non-zero exit status"; exit 1; }
else
  [ "$rc" -eq "$want_rc" ] || { echo "FAIL: expected exit status $want_rc"; exit 1; }
fi
grep -Ezq -- "$regex" <<<"$out" || { echo "FAIL: output does not match: $regex"; exit 1; }
if [ -n "$reject" ] && grep -Ezq -- "$reject" <<<"$out"; then
  echo "FAIL: output matches what it must not: $reject"
  exit 1
fi
echo PASS
