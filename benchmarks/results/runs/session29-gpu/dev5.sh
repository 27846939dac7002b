#!/usr/bin/env bash
# session 29, call E (x2): the whole multi-GPU test file on the committed tree (every 2-GPU run now all-reduces rank 0's test perplexity in float64 over NCCL)
set -u
source scripts/device/env.sh
export RUSTYFLOW_CACHE_DIR=/tmp/rf-cache
mkdir -p $OUT/e
git log -1 --format=%h > $OUT/e/commit.txt 2>&1
timeout -k 5 480 python3 -m pytest -q -p no:cacheprovider -rs tests/test_multi_gpu.py tests/test_zero1_compute_gather.py > $OUT/e/tests.txt 2>&1
echo "tests rc=$?" >> $OUT/e/tests.txt
tail -15 $OUT/e/tests.txt
