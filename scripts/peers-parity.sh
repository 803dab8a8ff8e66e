#!/usr/bin/env bash
# On a GPU machine (python3 with PyTorch): shows that flashkv's own peers (flashkv.bench.peers)
# measure what the project's earlier peer script measured, in one run on the same inputs:
#   scripts/peers-parity.sh PATH/TO/peers_torch.py
# Decode D1-D4 and prefill P1, P4 on GQA 32/8 and MHA 32/32, SDPA flash / cuDNN / efficient and
# FA2 varlen, two rounds alternating which goes first; FlexAttention on P1 and P4 (GQA) while
# the first 120 s last. Writes parity.json (every sample), parity.md (the table, also printed)
# and parity.log to $OUT, else ./peers-parity-logs. About 2-3 minutes on an H100; the run is cut
# at 230 s (what was measured by then is in parity.json).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SHARED=${1:?usage: scripts/peers-parity.sh PATH/TO/peers_torch.py}
[ -f "$SHARED" ] || { echo "peers-parity: no file $SHARED" >&2; exit 2; }
LOGS=${OUT:-peers-parity-logs}
mkdir -p "$LOGS"
timeout -k 10 230 python3 scripts/peers_parity.py --shared "$SHARED" --out "$LOGS" \
  2>&1 | tee "$LOGS/parity.log"
exit "${PIPESTATUS[0]}"
