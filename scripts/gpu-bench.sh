#!/usr/bin/env bash
# On a GPU machine, one command for every benchmark result:
#   decode         `flashkv bench` (ceilings, merge, decode D1-D6, plan time) and the CUDA-core
#                  decode kernel for comparison
#   prefill        `flashkv bench prefill` (P1-P5, A1, S1; ceilings again, in the same run)
#   decode-peers   torch peers on D1-D6 (bench/decode_peers.py)
#   prefill-peers  torch peers on P1-P5, A1, S1 (bench/prefill_peers.py; PEERS_ARGS, e.g.
#                  --no-flex, go to it)
#   summary        ../shared/bench/peers_torch.py --summarize: flashkv's fp16 rows beside the peers,
#                  as decode.*, prefill.* and all.* (.md, .png, .json), from whichever
#                  result files exist in the results folder
# The peers scripts run functions of ../shared/bench/peers_torch.py (imported from PEERS).
#   scripts/gpu-bench.sh PATH/TO/peers_torch.py [BUILD_DIR]
#   PARTS="prefill prefill-peers summary" scripts/gpu-bench.sh ...   # a subset (default: all)
# Results go to $OUT if set, else ./bench-out. Commit the ones that back a claim under bench/results/.
# Exits non-zero when a flashkv benchmark failed, e.g. a prefill configuration failed its
# reference check (results and tables are written first).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PEERS=${1:?usage: scripts/gpu-bench.sh PATH/TO/peers_torch.py [BUILD_DIR]}
BUILD=${2:-build}
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
  python3 bench/decode_peers.py --peers "$PEERS" --out "$RES/peers-decode.json" | tee "$RES/peers.log"
fi
if has prefill-peers; then
  # shellcheck disable=SC2086  # PEERS_ARGS is a list of options
  python3 bench/prefill_peers.py --peers "$PEERS" --out "$RES/peers-prefill.json" ${PEERS_ARGS:-} \
    | tee "$RES/peers-prefill.log"
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
  summarize() {  # NAME FILE...: the files of the list that exist, merged into NAME.{md,png,json}
    local name=$1 files=() f
    shift
    for f in "$@"; do [ -f "$RES/$f" ] && files+=("$RES/$f"); done
    [ ${#files[@]} -gt 0 ] || return 0
    python3 "$PEERS" --summarize "${files[@]}" --md "$RES/$name.md" --png "$RES/$name.png" \
      --json-out "$RES/$name.json" | tee "$RES/$name-summary.txt"
  }
  summarize decode flashkv-decode-f16.json peers-decode.json
  summarize prefill flashkv-prefill-f16.json peers-prefill.json
  summarize all flashkv-decode-f16.json flashkv-prefill-f16.json peers-decode.json \
    peers-prefill.json
fi
exit $status
