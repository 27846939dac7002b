#!/usr/bin/env bash
# session 29, call G (x2): after Wire.hand_to, ZeRO-1 in bf16 on 2 GPUs again
set -u
source scripts/device/env.sh
export RUSTYFLOW_CACHE_DIR=/tmp/rf-cache
mkdir -p $OUT/g
timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py -k "zero1_in_bf16 or two_gpus_match" > $OUT/g/tests.txt 2>&1
echo "tests rc=$?" >> $OUT/g/tests.txt
tail -4 $OUT/g/tests.txt
