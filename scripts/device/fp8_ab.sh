#!/usr/bin/env bash
# PRECISION=fp8 before and after a change, on one machine (the lent GPUs differ: the same code
# cast 3.18 ms a step on one H200 and 3.94 ms on another, so only a comparison on one machine
# separates the change from the machine). The tree before is .devdata/old, made here with
#   mkdir -p .devdata/old && git archive REV rustyflow_py benchmarks configs pyproject.toml \
#       | tar -x -C .devdata/old
# and this tree is after. For each: this tree's benchmarks/fp8_casts.py (the casts, kernel by
# kernel) and vs_pytorch.py's graph rows at B=16 with their kernel list, old then new. TESTS=1
# runs the fp8 tests first (TEST_FILES: more test files); PRECISIONS (default
# bf16,fp8-delayed) sets the rows. The device returns at most 8 files: the new tree's tables
# and the tests' tail land in $OUT, everything (logs, the old tree's) in $OUT/ab.tgz.
set -u
source scripts/device/env.sh
final=${OUT:-.}
out=$(mktemp -d)
here=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
if [ "${TESTS:-1}" = 1 ]; then
  # shellcheck disable=SC2086
  timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider tests/test_fp8_gemms.py \
    tests/test_fp8.py ${TEST_FILES:-} > "$out/tests.txt" 2>&1
  echo "tests rc=$?"; tail -3 "$out/tests.txt"
fi
for side in old new; do
  dir=$here; [ "$side" = old ] && dir=$here/.devdata/old
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir python3 "$here/benchmarks/fp8_casts.py" \
    --out "$out/casts-$side.md" > "$out/casts-$side.log" 2>&1)
  echo "casts $side rc=$?"; grep -E "^\| " "$out/casts-$side.md" | tail -7
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout "${VS_TIMEOUT:-200}" python3 \
    benchmarks/vs_pytorch.py --device gpu --shapes gpt2-b16 \
    --precisions "${PRECISIONS:-bf16,fp8-delayed}" --skip-eager --skip-compile --windows 5 \
    --curve-steps 0 --kernel-list "$out/kernels-$side.md" --out "$out/vs-$side.md" \
    > "$out/vs-$side.log" 2>&1)
  echo "vs_pytorch $side rc=$?"; grep -E "rustyflow graph" "$out/vs-$side.md" | cut -d"|" -f3,5,6,9 | head -4
done
tar czf "$final/ab.tgz" -C "$out" .
cp "$out/gpu.txt" "$out/casts-new.md" "$out/kernels-new.md" "$out/vs-new.md" "$final/"
tail -40 "$out/tests.txt" > "$final/tests-tail.txt" 2>/dev/null

