#!/usr/bin/env bash
# On a GPU machine, one command for every benchmark result:
#   decode         `flashkv bench` (ceilings, merge, decode D1-D6, plan time) and the CUDA-core
#                  decode kernel for comparison
#   prefill        `flashkv bench prefill` (P1-P5, A1, S1; ceilings again, in the same run)
#   decode-peers   the peers on D1-D6 (bench/run_peers.py, flashkv.bench.peers)
#   prefill-peers  the peers on P1-P5, A1, S1 (PEERS_ARGS, e.g. --workloads P1 P4, go to it)
#   summary        flashkv's fp16 rows beside the peers' (bench/run_peers.py --merge), as
#                  decode.*, prefill.* and all.* (.md, .json, and plots in *-plots/), from
#                  whichever result files exist in the results folder
#   scripts/gpu-bench.sh [BUILD_DIR]
#   PEERS=torch,flashinfer scripts/gpu-bench.sh        # which peers (default: torch; see
#                                                      # bench/run_peers.py --help)
#   PARTS="prefill prefill-peers summary" scripts/gpu-bench.sh   # a subset (default: all)
# The peers need only python3 with PyTorch (FlashInfer 0.7 too for the flashinfer peers), not a
# build of flashkv's Python package. Results go to $OUT if set, else ./bench-out. Commit the ones
# that back a claim under bench/results/. Exits non-zero when a flashkv benchmark failed, e.g. a
# prefill configuration failed its reference check (results and tables are written first).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" != "" ] && [ "${1%.py}" != "$1" ]; then
  echo "gpu-bench.sh: the peers are flashkv's own code now; pass BUILD_DIR, not $1" >&2
  echo "  (choose peers with PEERS=torch,flashinfer; see bench/run_peers.py --help)" >&2
  exit 2
fi
BUILD=${1:-build}
PEERS=${PEERS:-torch}
RES=${OUT:-bench-out}
PARTS=" ${PARTS:-decode prefill decode-peers prefill-peers summary} "
has() { [[ "$PARTS" == *" $1 "* ]]; }
mkdir -p "$RES"
if [ ! -x "$BUILD/flashkv" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD" --target flashkv_cli || exit 1
fi
status=0
if has decode; then
  "$BUILD/flashkv" bench ceilings merge decode --json "$RES/flashkv-decode.json" | tee "$RES/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  "$BUILD/flashkv" bench decode --no-plan-time --dtypes f16 --decode-backend cuda \
    --json "$RES/flashkv-decode-cudacores.json" | tee "$RES/bench-cudacores.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if has prefill; then
  "$BUILD/flashkv" bench prefill --json "$RES/flashkv-prefill.json" --md "$RES/flashkv-prefill.md" \
    | tee "$RES/bench-prefill.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if has decode-peers; then
  python3 bench/run_peers.py --peers "$PEERS" --kinds decode --out "$RES/peers-decode.json" \
    | tee "$RES/peers.log"
fi
if has prefill-peers; then
  # shellcheck disable=SC2086  # PEERS_ARGS is a list of options
  python3 bench/run_peers.py --peers "$PEERS" --kinds prefill append \
    --out "$RES/peers-prefill.json" ${PEERS_ARGS:-} | tee "$RES/peers-prefill.log"
fi
if has summary; then
  # The peers are fp16: summarize flashkv's fp16 rows beside them.
  python3 - "$RES" <<'PY'
import json, os, sys
res = sys.argv[1]
for kind in ("decode", "prefill"):
    if os.path.exists(f"{res}/flashkv-{kind}.json"):
        d = json.load(open(f"{res}/flashkv-{kind}.json"))
        d["results"] = [r for r in d["results"] if r["dtype"] == "f16"]
        json.dump(d, open(f"{res}/flashkv-{kind}-f16.json", "w"), indent=1)
PY
  summarize() {  # NAME FILE...: the files of the list that exist, merged into NAME.*
    local name=$1 files=() f
    shift
    for f in "$@"; do [ -f "$RES/$f" ] && files+=("$RES/$f"); done
    [ ${#files[@]} -gt 0 ] || return 0
    python3 bench/run_peers.py --merge "${files[@]}" --md "$RES/$name.md" \
      --json "$RES/$name.json" --plots "$RES/$name-plots" | tee "$RES/$name-summary.txt"
  }
  summarize decode flashkv-decode-f16.json peers-decode.json
  summarize prefill flashkv-prefill-f16.json peers-prefill.json
  summarize all flashkv-decode-f16.json flashkv-prefill-f16.json peers-decode.json \
    peers-prefill.json
fi
exit $status
