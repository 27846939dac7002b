#!/usr/bin/env bash
# A recipe sweep in ONE device call of at most 10 minutes (carry [".whl", ".devdata"]):
# benchmarks/quality_sweep.py with the arguments given (their runs' checkpoints in /dev/shm),
# its table in $OUT/sweep.md (rewritten after each run), and every run's log and console in
# $OUT/sweep.tgz. The sweep is stopped after BUDGET seconds (default 570), before the call's
# limit, so that the logs of the runs it finished come back. For example, on 4 GPUs:
#   bash scripts/device/quality_tune.sh --config configs/wikitext2-quality.env \
#       --devices gpu:0,gpu:1,gpu:2,gpu:3 --timeout 540 --variant base= \
#       --variant "l12=--num-layers 12"
# A device named twice in --devices runs two runs at once on it (tuning only: their wall
# times are those of runs sharing a GPU, and the table's header says so).
set -u
root=$PWD
out=${OUT:-$root/quality-tune-out}
work=/dev/shm/rf-tune
rm -rf "$work"  # a warm machine keeps /dev/shm: start clean
mkdir -p "$out" "$work/runs"
source scripts/device/env.sh
export RUSTYFLOW_CACHE_DIR=/tmp/rf-cache
finish() { tar -C "$work" -czf "$out/sweep.tgz" --exclude='*.npz' .; }
trap finish EXIT
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$work/gpu.txt"
timeout "${BUDGET:-570}" python3 benchmarks/quality_sweep.py --work "$work/runs" \
    --out "$out/sweep.md" "$@"
