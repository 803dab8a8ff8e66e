#!/usr/bin/env bash
# On a GPU machine: `flashkv bench` (ceilings, merge, decode D1-D6, plan time), the CUDA-core
# kernel for comparison, the torch peers on the decode workloads (bench/decode_peers.py, which
# runs ../shared/bench/peers_torch.py's functions), and the merged table + plot.
#   scripts/gpu-bench.sh PATH/TO/peers_torch.py [BUILD_DIR]
# Results go to $OUT if set, else ./bench-out. Commit the ones that back a claim under bench/results/.
set -uo pipefail
cd "$(dirname "$0")/.."
PEERS=${1:?usage: scripts/gpu-bench.sh PATH/TO/peers_torch.py [BUILD_DIR]}
BUILD=${2:-build}
RES=${OUT:-bench-out}
mkdir -p "$RES"
if [ ! -x "$BUILD/flashkv" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD" --target flashkv_cli || exit 1
fi
"$BUILD/flashkv" bench ceilings merge decode --json "$RES/flashkv-decode.json" | tee "$RES/bench.log"
"$BUILD/flashkv" bench decode --no-plan-time --dtypes f16 --decode-backend cuda \
  --json "$RES/flashkv-decode-cudacores.json" | tee "$RES/bench-cudacores.log"
python3 bench/decode_peers.py --peers "$PEERS" --out "$RES/peers-decode.json" | tee "$RES/peers.log"
# The peers are fp16: summarize flashkv's fp16 rows beside them.
python3 - "$RES" <<'PY'
import json, sys
res = sys.argv[1]
d = json.load(open(f"{res}/flashkv-decode.json"))
d["results"] = [r for r in d["results"] if r["dtype"] == "f16"]
json.dump(d, open(f"{res}/flashkv-decode-f16.json", "w"), indent=1)
PY
python3 "$PEERS" --summarize "$RES/flashkv-decode-f16.json" "$RES/peers-decode.json" \
  --md "$RES/decode.md" --png "$RES/decode.png"
