#!/usr/bin/env bash
# On a GPU machine: an A/B of two flashkv builds in one command, alternating A, B, A, B, ...
#   scripts/gpu-ab.sh DIR_A DIR_B [ROUNDS] -- BENCH_ARGS...
#   e.g. scripts/gpu-ab.sh build-main build-branch 3 -- prefill --workloads P1 P4 P5 --dtypes f16
# DIR_A / DIR_B hold a `flashkv` binary each (build folders, or binaries carried to the machine),
# built beforehand from the two trees. Each JIT-compiles kernels from its own embedded sources, keyed
# by them, so one kernel cache (FLASHKV_CACHE_DIR) serves both; the first round pays the compiles
# of kernels the cache lacks, so give 3 rounds (the default) and read the medians.
# Writes $OUT (or ./ab-out): ab.log (every run's output), {a,b}-ROUND.json, and ab.md
# (scripts/ab_summary.py: per row the median time of each side, B / A, the reference checks).
# Why alternate: a GPU's clocks and the host drift over minutes; A and B interleaved see the same.
# Exits non-zero if a run failed (a reference check included) or the summary could not be made.
set -uo pipefail
usage="usage: scripts/gpu-ab.sh DIR_A DIR_B [ROUNDS] -- BENCH_ARGS..."
[ $# -ge 3 ] || { echo "$usage" >&2; exit 2; }
A=$1 B=$2
shift 2
ROUNDS=3
if [ "$1" != -- ]; then ROUNDS=$1; shift; fi
[ "${1:-}" = -- ] || { echo "$usage" >&2; exit 2; }
shift
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "gpu-ab: ROUNDS must be a positive integer, got '$ROUNDS'" >&2; exit 2; }
for d in "$A" "$B"; do
  [ -x "$d/flashkv" ] || { echo "gpu-ab: no flashkv binary in '$d'" >&2; exit 2; }
done
RES=${OUT:-ab-out}
mkdir -p "$RES"
here=$(cd "$(dirname "$0")" && pwd)
status=0
for ((r = 1; r <= ROUNDS; ++r)); do
  for side in a b; do
    dir=$A; [ $side = b ] && dir=$B
    echo "=== round $r, $side: $dir/flashkv bench $*" >> "$RES/ab.log"
    "$dir/flashkv" bench "$@" --json "$RES/$side-$r.json" >> "$RES/ab.log" 2>&1 ||
      { status=1; echo "gpu-ab: round $r, $side failed (exit $?): see ab.log" | tee -a "$RES/ab.log" >&2; }
  done
done
python3 "$here/ab_summary.py" --label-a "$(basename "$A")" --label-b "$(basename "$B")" \
  --a "$RES"/a-*.json --b "$RES"/b-*.json > "$RES/ab.md" || status=1
cat "$RES/ab.md"
exit $status
