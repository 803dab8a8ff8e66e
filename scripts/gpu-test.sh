#!/usr/bin/env bash
# Runs the GPU tests and `flashkv verify` on a machine with a CUDA GPU, writing logs.
#   scripts/gpu-test.sh [BUILD_DIR]     (default: build; built here if it has no binaries)
# Logs go to $OUT if set (the device tool's output folder), else ./gpu-test-logs.
# FLASHKV_CACHE_DIR may point at a precompiled kernel cache (flashkv precompile --arch sm_90a).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
LOGS=${OUT:-gpu-test-logs}
mkdir -p "$LOGS"
if [ ! -x "$BUILD/flashkv" ] || [ ! -x "$BUILD/tests/flashkv_gpu_tests" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD" || exit 1
fi
status=0
"$BUILD/flashkv" info 2>&1 | tee "$LOGS/info.log"
"$BUILD/tests/flashkv_gpu_tests" --gtest_brief=1 2>&1 | tee "$LOGS/gpu-tests.log" || status=1
"$BUILD/flashkv" verify --json "$LOGS/verify.json" 2>&1 | tee "$LOGS/verify.log" || status=1
if command -v compute-sanitizer >/dev/null; then
  # Memory and race checks on a representative subset (the full suite under the sanitizer is slow).
  filter='DecodeGpu.BothLayoutsAndInterleavingAgree:DecodeGpu.AllEmptyAndSingleTokenBatches:MergeGpu.*:DecodeGraphGpu.BadInputsRaiseNamedErrors'
  filter+=':PrefillGpu.AllEmptyAndTinyBatches:PrefillGpu.LongKvFewTilesSplitsAcrossCtas:PrefillGpu.QueryLongerThanKvFirstRowsSeeNothing'
  filter+=':DeviceErrorsGpu.AppendBadInputWritesNothingForThatTokenAndRaises:KvAppendGpu.EveryLayoutMatchesReferenceBitwise'
  filter+=':DeviceErrorsGpu.DecodeRunReportsOutOfRangePageIds:DecodeBadInputGpu.*'
  filter+=':RopeGpu.StridedRowsVectorAndScalarPaths'
  filter+=':DecodeStepGpu.Llama31GqaMatchesUnfusedAndReference:DecodeStepGpu.BadInputsRaiseNamedErrors'
  filter+=':CascadeGpu.TwoAndThreeLevelsMatchPlainAttention'
  filter+=':DecodeVariantsGpu.UserVariantWithEveryHookOnBothKernels:PrefillVariantsGpu.Sinks:PrefillVariantsGpu.SlidingWindow'
  filter+=':PrefillVariantsGpu.RopeOverFp8Cache:DecodeVariantsGpu.RopeOverFp8CacheOnBothKernels'
  compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD/tests/flashkv_gpu_tests" --gtest_filter="$filter" \
    > "$LOGS/memcheck.log" 2>&1 || { status=1; echo "memcheck FAILED"; }
  compute-sanitizer --tool racecheck --error-exitcode 3 "$BUILD/tests/flashkv_gpu_tests" \
    --gtest_filter='DecodeGpu.BothLayoutsAndInterleavingAgree:MergeGpu.MergeStatesMatchesReference:PrefillGpu.LongKvFewTilesSplitsAcrossCtas:PrefillGpu.AllEmptyAndTinyBatches:RopeGpu.EmptyAndSingleTokenBatches:DecodeStepGpu.Llama31GqaMatchesUnfusedAndReference:CascadeGpu.AutomaticUseFollowsTheCostModel:DecodeVariantsGpu.EveryBuiltinOnBothKernelsWithSplitKV:DecodeVariantsGpu.RopeOverFp8CacheOnBothKernels' \
    > "$LOGS/racecheck.log" 2>&1 || { status=1; echo "racecheck FAILED"; }
  tail -n 3 "$LOGS/memcheck.log" "$LOGS/racecheck.log"
fi
echo "gpu-test: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
