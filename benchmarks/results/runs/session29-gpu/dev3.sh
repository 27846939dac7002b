#!/usr/bin/env bash
# session 29, call B (x4): the final table, both shapes, 1/2/4 GPUs, defaults / ZeRO-1+bf16 wire / the same profiled
set -u
OUT=$OUT/t BUDGET=575 GPUS="2 4" EPOCHS=3 LOG_INTERVAL=25 \
  VARIANTS="fp32: zerobf16:--shard-optimizer,--grad-reduce-dtype=bf16 zerobf16prof:--shard-optimizer,--grad-reduce-dtype=bf16,--profile" \
  bash scripts/device/dp_ab.sh > /dev/null 2>&1
cat $OUT/t/table.md $OUT/t/summary.txt
cd $OUT && tar czf t.tgz t && rm -rf t
