#!/usr/bin/env bash
# session 29, call F (x2): the dead and stopped rank tests under the device's Open MPI, after the test harness reads OMPI_COMM_WORLD_RANK
set -u
source scripts/device/env.sh
export RUSTYFLOW_CACHE_DIR=/tmp/rf-cache
mkdir -p $OUT/f
timeout -k 5 240 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py -k dead_or_stopped > $OUT/f/tests.txt 2>&1
echo "tests rc=$?" >> $OUT/f/tests.txt
tail -8 $OUT/f/tests.txt
