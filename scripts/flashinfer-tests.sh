#!/usr/bin/env bash
# FlashInfer's own attention tests against flashkv.compat.flashinfer (issue 43), on a GPU machine:
#   scripts/flashinfer-tests.sh FLASHINFER_DIR OUT_JSON [TAG] [-- PYTEST_ARGS...]
# FLASHINFER_DIR: a FlashInfer checkout (or a copy holding its tests/attention/*.py,
# tests/test_helpers/ and tests/__init__.py; never commit those files here). The flashkv package
# must be importable (PYTHONPATH). The tests are copied into a scratch dir WITHOUT FlashInfer's
# conftest files (they import FlashInfer's JIT internals); scripts/flashinfer_tests/
# flashinfer_tests_plugin.py installs the namespace as `flashinfer`, samples at most
# FLASHKV_FI_MAX_PER_FUNCTION (default 25) parametrizations per test function, and writes
# OUT_JSON: pass / fail / unsupported (NotImplementedError) / skipped counts per file, with the
# tag and totals. FI_FILES (space-separated file names) overrides the default file list below;
# FI_JOBS sets pytest-xdist workers (default 8, 0 = none); FI_TIMEOUT the per-test limit (s).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
FI=${1:?usage: flashinfer-tests.sh FLASHINFER_DIR OUT_JSON [TAG] [-- PYTEST_ARGS...]}
OUT_JSON=${2:?usage: flashinfer-tests.sh FLASHINFER_DIR OUT_JSON [TAG]}
TAG=${3:-unknown}
shift $(( $# >= 3 ? 3 : $# ))
[ "${1:-}" = "--" ] && shift
[ -d "$FI/tests/attention" ] || { echo "flashinfer-tests: no $FI/tests/attention" >&2; exit 2; }
# The attention tests of the API the namespace maps. Left out (other backends, nothing to map):
# Blackwell / sm120 / NVFP4 (test_blackwell_*, *_sm120, nvfp4), cuDNN, TRT-LLM-gen, XQA, CuTe-DSL,
# fmha_v2 / modular FMHA, VSA, MLA (test_*mla*, test_deepseek_mla: flashkv's MLA is its own
# work), context parallelism (test_parallel_attention, multi-GPU).
DEFAULT_FILES="test_alibi.py test_attention_sink.py test_batch_attention.py
test_batch_decode_kernels.py test_batch_invariant_fa2.py test_batch_prefill.py
test_batch_prefill_kernels.py test_block_sparse.py test_decode_fp8_calibration_scale.py
test_decode_prefill_lse.py test_fp8_prefill.py test_hopper.py test_hopper_fp8_attention.py
test_hopper_fp8_sliding_window.py test_logits_cap.py test_non_contiguous_decode.py
test_non_contiguous_prefill.py test_page.py test_rope.py test_shared_prefix_kernels.py
test_single_prefill.py test_sliding_window.py test_tensor_cores_decode.py test_workspace_size.py"
FILES=${FI_FILES:-$DEFAULT_FILES}
RUN=$(mktemp -d -t flashinfer-tests.XXXXXX)
trap 'rm -rf "$RUN"' EXIT
mkdir -p "$RUN/tests/attention"
cp "$FI/tests/__init__.py" "$RUN/tests/" 2>/dev/null || touch "$RUN/tests/__init__.py"
touch "$RUN/tests/attention/__init__.py"
cp -r "$FI/tests/test_helpers" "$RUN/tests/"
ARGS=()
for f in $FILES; do
  if [ -f "$FI/tests/attention/$f" ]; then
    cp "$FI/tests/attention/$f" "$RUN/tests/attention/"
    ARGS+=("tests/attention/$f")
  else
    echo "flashinfer-tests: $f not in $FI/tests/attention (skipped)" >&2
  fi
done
JOBS=${FI_JOBS:-8}
XDIST=()
if [ "$JOBS" != 0 ] && python3 -c "import xdist" 2>/dev/null; then
  XDIST=(-n "$JOBS")
fi
TIMEOUT=()
if python3 -c "import pytest_timeout" 2>/dev/null; then
  TIMEOUT=(--timeout="${FI_TIMEOUT:-120}")
fi
OUT_ABS=$(cd "$(dirname "$OUT_JSON")" && pwd)/$(basename "$OUT_JSON")
cd "$RUN"
FLASHKV_FI_RESULTS="$OUT_ABS" FLASHKV_FI_TAG="$TAG" \
  PYTHONPATH="$HERE/flashinfer_tests:$RUN:${PYTHONPATH:-}" USER="${USER:-ci}" \
  python3 -m pytest -q -p no:cacheprovider -p flashinfer_tests_plugin --rootdir="$RUN" \
  --continue-on-collection-errors "${TIMEOUT[@]}" "${XDIST[@]}" -o addopts="" "${ARGS[@]}" "$@" | tail -n 30
status=${PIPESTATUS[0]}
python3 - "$OUT_ABS" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("flashinfer-tests:", d["flashinfer_tag"], json.dumps(d["totals"]))
PY
exit "$status"
