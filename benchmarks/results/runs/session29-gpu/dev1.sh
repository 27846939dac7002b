#!/usr/bin/env bash
# session 29, call 1 (x4): the new ZeRO-1 compute-copy gather's tests on 2 GPUs, then old vs new at medium and GPT-2 on 2 GPUs
set -u
source scripts/device/env.sh
export RUSTYFLOW_CACHE_DIR=/tmp/rf-cache
mkdir -p $OUT/t
nvidia-smi -L > $OUT/t/gpus.txt
( CUDA_VISIBLE_DEVICES=0,1 timeout -k 5 290 python3 -m pytest -q -p no:cacheprovider -x \
    tests/test_zero1_compute_gather.py tests/test_multi_gpu.py \
    -k "zero1 or sharded_checkpoint or two_gpus_match or replayed_two_gpu" ) > $OUT/t/tests.txt 2>&1
echo "tests rc=$?" >> $OUT/t/tests.txt
tail -5 $OUT/t/tests.txt
OUT=$OUT/ab BUDGET=280 SHAPES="medium gpt2" GPUS="2" EPOCHS=3 LOG_INTERVAL=25 \
  VARIANTS="old:@.devdata/old,--shard-optimizer,--grad-reduce-dtype=bf16 new:--shard-optimizer,--grad-reduce-dtype=bf16" \
  bash scripts/device/dp_ab.sh > /dev/null 2>&1
cat $OUT/ab/table.md $OUT/ab/summary.txt
for s in medium gpt2; do diff <(grep -oE "^  step .*loss [0-9.]+" $OUT/ab/$s-gpus2-old.txt) <(grep -oE "^  step .*loss [0-9.]+" $OUT/ab/$s-gpus2-new.txt) > /dev/null && echo "$s old/new step lines identical" || echo "$s old/new step lines differ"; done
cd $OUT && tar czf ab.tgz ab && rm -rf ab
