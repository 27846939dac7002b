#!/usr/bin/env bash
# PRECISION=fp8 on the device, in one call: its tests (the FP8 GEMMs and casts, the ops and
# a captured training run in fp8 beside bf16 and fp16), then GPT-2 124M's bf16 and fp8 graph
# rows through vs_pytorch.py with their kernel lists, and the loss curves of fp8 and bf16
# against PyTorch's bf16. Everything lands in $OUT. TESTS=0 skips the tests; SHAPES, CURVE,
# PRECISIONS (default bf16,fp8,fp8-delayed: both FP8 scalings) and VS_TIMEOUT set the
# benchmark's shapes, curve steps, precisions and time.
set -u
source scripts/device/env.sh
out=${OUT:-.}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
if [ "${TESTS:-1}" = 1 ]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_gemms.py tests/test_fp8.py \
    tests/test_cublaslt.py tests/test_mixed_precision.py tests/test_kernel_contract.py \
    > "$out/tests.txt" 2>&1
  echo "tests rc=$?"; tail -5 "$out/tests.txt"
fi
timeout "${VS_TIMEOUT:-330}" python3 benchmarks/vs_pytorch.py --device gpu \
  --shapes "${SHAPES:-gpt2-b16,gpt2-b32}" --precisions "${PRECISIONS:-bf16,fp8,fp8-delayed}" \
  --skip-eager --skip-compile --windows 5 --curve-steps "${CURVE:-2000}" \
  --curve-precisions "${PRECISIONS:-bf16,fp8,fp8-delayed}" \
  --kernel-list "$out/fp8-kernels.md" --out "$out/fp8-vs.md" > "$out/fp8-vs.log" 2>&1
echo "vs_pytorch rc=$?"; grep -E "rustyflow|pytorch|fp8 against|^\| (bf16|fp8)" "$out/fp8-vs.md" | head -20
tail -3 "$out/fp8-vs.log"
