#!/usr/bin/env bash
# precompile_jobs.sh FLASHKV: `flashkv precompile -j 2` writes the same disk-cache entries as
# -j 1 (each into its own fresh FLASHKV_CACHE_DIR), reports every kernel once as "[i/N] ...
# compiled", and a second run (-j 2) finds every entry valid and cached. NVRTC needs no GPU; a few kernels, seconds.
set -euo pipefail
flashkv=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(precompile --arch sm_90a --ops merge kv --dtypes f16)
for j in 1 2; do
  FLASHKV_CACHE_DIR="$tmp/j$j" "$flashkv" "${args[@]}" -j "$j" --json "$tmp/j$j.json" \
    | tee "$tmp/j$j.log"
done
n=$(grep -c '^\[[0-9]*/4\] .* compiled' "$tmp/j2.log") || true
[ "$n" -eq 4 ] || { echo "FAIL: -j 2 reported $n of 4 kernels compiled"; exit 1; }
for i in 1 2 3 4; do
  grep -q "^\[$i/4\]" "$tmp/j2.log" || { echo "FAIL: no [$i/4] progress line"; exit 1; }
done
grep -q '^4 compiled, 0 cached' "$tmp/j2.log" || { echo "FAIL: -j 2 summary"; exit 1; }
ls "$tmp/j1" >"$tmp/j1.ls"
ls "$tmp/j2" >"$tmp/j2.ls"
[ "$(wc -l <"$tmp/j1.ls")" -eq 4 ] || { echo "FAIL: -j 1 wrote $(wc -l <"$tmp/j1.ls") entries, not 4"; exit 1; }
diff "$tmp/j1.ls" "$tmp/j2.ls" || { echo "FAIL: -j 1 and -j 2 wrote different entries"; exit 1; }
# (Not byte for byte: NVRTC's cubin of one kernel here differs between two serial runs.)
FLASHKV_CACHE_DIR="$tmp/j2" "$flashkv" "${args[@]}" -j 2 | tee "$tmp/again.log"
grep -q '^0 compiled, 4 cached' "$tmp/again.log" || { echo "FAIL: a second run recompiled"; exit 1; }
echo PASS
