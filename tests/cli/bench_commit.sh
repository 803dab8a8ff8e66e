#!/usr/bin/env bash
# bench_commit.sh FLASHKV SOURCE_DIR
# The benchmark JSON names the commit the CLI was built from (cmake/BuildCommit.cmake, regenerated
# at every build), so a binary carried to a GPU machine reports its own tree: here, the source
# tree's HEAD (with "-dirty" where tracked files differ), or FLASHKV_COMMIT when that is set.
set -uo pipefail
fk=$1 src=$2
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
commit_of() {  # the "commit" field of the JSON file $1
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["commit"])' "$1"
}
CUDA_VISIBLE_DEVICES="" "$fk" bench decode --workloads D1 --reps 1 --dtypes f16 \
  --json "$tmp/a.json" > "$tmp/a.log" 2>&1 || { cat "$tmp/a.log"; echo "FAIL: bench failed"; exit 1; }
got=$(commit_of "$tmp/a.json")
if head=$(git -C "$src" rev-parse --short HEAD 2>/dev/null); then
  [[ "$got" == "$head" || "$got" == "$head-dirty" ]] ||
    { echo "FAIL: commit '$got', the source tree is at '$head' (rebuild to refresh it)"; exit 1; }
else
  [ -n "$got" ] || { echo "FAIL: empty commit"; exit 1; }
fi
FLASHKV_COMMIT=abc1234 CUDA_VISIBLE_DEVICES="" "$fk" bench decode --workloads D1 --reps 1 \
  --dtypes f16 --json "$tmp/b.json" > "$tmp/b.log" 2>&1 || { cat "$tmp/b.log"; exit 1; }
[ "$(commit_of "$tmp/b.json")" = abc1234 ] || { echo "FAIL: FLASHKV_COMMIT not recorded"; exit 1; }
echo "PASS: commit $got"
