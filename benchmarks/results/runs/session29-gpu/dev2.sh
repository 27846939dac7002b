#!/usr/bin/env bash
# session 29, call A (x4): GPU tests on GPUs 2,3 beside the loss curves of 1 GPU x 32 and x 64 (medium, 3 epochs) on GPUs 0 and 1
set -u
source scripts/device/env.sh
export RUSTYFLOW_CACHE_DIR=/tmp/rf-cache
mkdir -p $OUT/c
( CUDA_VISIBLE_DEVICES=2,3 timeout -k 5 400 python3 -m pytest -q -p no:cacheprovider \
    tests/test_zero1_compute_gather.py tests/test_multi_gpu.py \
    -k "zero1 or replayed_two_gpu" ) > $OUT/c/tests.txt 2>&1 &
tp=$!
for b in 32 64; do
  ( CUDA_VISIBLE_DEVICES=$(( b / 32 - 1 )) timeout -k 5 300 python3 -m rustyflow_py train --config configs/medium.env \
      --precision bf16 --device gpu --num-epochs 3 --warmup-steps 10 --eval-tokens 16384 --log-interval 25 \
      --no-profile --batch-size $b --log-file $OUT/c/medium-b$b.log --model-path /dev/shm/m$b.npz ) > $OUT/c/medium-b$b.txt 2>&1 &
done
wait
echo "tests: $(tail -1 $OUT/c/tests.txt)"
grep -E "FAILED|Error" $OUT/c/tests.txt | head
grep -c "loss" $OUT/c/medium-b32.txt $OUT/c/medium-b64.txt
cd $OUT && tar czf c.tgz c && rm -rf c
