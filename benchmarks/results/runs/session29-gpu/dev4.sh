#!/usr/bin/env bash
# session 29, call D (x4): the scaling model's inputs for ZeRO-1: NCCL all-reduce sweeps on 2 and 4 GPUs, and each shape's 1-GPU run with the profile on (its phase times)
set -u
source scripts/device/env.sh
export RUSTYFLOW_CACHE_DIR=/tmp/rf-cache
o=$OUT/m; mkdir -p $o
for n in 2 4; do timeout 90 python3 benchmarks/allreduce_sweep.py --gpus $n --out $o/allreduce-$n.json > $o/sweep-$n.txt 2>&1; echo "sweep-$n rc=$?"; done
COMMON=(--device gpu --num-epochs 2 --warmup-steps 10 --eval-tokens 16384 --log-interval 1000 --profile)
timeout 120 python3 -m rustyflow_py train --gpus 1 --config configs/medium.env --precision bf16 "${COMMON[@]}" \
  --log-file $o/medium.log --model-path /dev/shm/m.npz > $o/medium-gpus1-profile-on.txt 2>&1; echo "medium rc=$?"
timeout 150 python3 -m rustyflow_py train --gpus 1 --config configs/medium.env --precision bf16 --seq-len 1024 --batch-size 16 \
  --tokenizer bpe --bpe-vocab 50257 "${COMMON[@]}" --log-file $o/gpt2.log --model-path /dev/shm/g.npz > $o/gpt2-gpus1-profile-on.txt 2>&1; echo "gpt2 rc=$?"
cd $OUT && tar czf m.tgz m && rm -rf m
