#!/usr/bin/env bash
# Data-parallel scaling through the user's command, for ONE multi-GPU call of at most 10
# minutes (nvidia-h100-x4 / h200-x4, or -x2 with GPUS="1 2"; carry [".whl", ".devdata"], and
# the baseline tree when BEFORE is set):
#   1. the NCCL all-reduce sweep on each GPU count above 1 (benchmarks/allreduce_sweep.py);
#   2. `rustyflow train --gpus N --config configs/medium.env --precision bf16` for each N in
#      GPUS, then the GPT-2 124M shape (L12 H12 E768, T=1024, B=16 per GPU, a 50,257-token
#      BPE trained on WikiText-2: GPT-2's own tokenizer files cannot be fetched there), each
#      one epoch with 16k evaluated tokens: on 1 GPU profile off and on, and for medium at
#      N x B too (the loss curve N GPUs of B must match); on N > 1 GPUs with the gradient
#      summed in each of REDUCE (profile off), the last of them with the profile on too, and
#      the code in BEFORE (a `git archive` of an older commit), if set, for the before/after;
#   3. the scaling model on what it measured (benchmarks/scaling_model.py --validate).
# BUCKETS="12.5 50" adds medium runs at those BUCKET_MB values.
# Everything lands under $OUT: the sweeps' JSON, one log per shape (run records), each run's
# output, the model's reports, and summary.txt (each step's exit status and seconds).
# Checkpoints go to /tmp (too large to bring back). Each step has its own timeout and the
# whole stays inside BUDGET seconds: a step that would not fit is skipped, and says so.
set -u
t_start=$SECONDS
BUDGET=${BUDGET:-570}
root=$PWD
out=${OUT:-$root/dp-scaling-out}
mkdir -p "$out" /tmp/rf-models
source scripts/device/env.sh
export RUSTYFLOW_CACHE_DIR=/tmp/rf-cache
GPUS=${GPUS:-1 2 4}
REDUCE=${REDUCE:-fp32 bf16}
BEFORE=${BEFORE:-}
SHAPES=${SHAPES:-medium gpt2}
BUCKETS=${BUCKETS:-}  # other BUCKET_MB values to try at medium, with the last of REDUCE

# step NAME LIMIT_S COMMAND...: output to $out/NAME.txt; skipped when the budget is short
step() {
    local name=$1 limit=$2 left t0 rc
    shift 2
    left=$(( BUDGET - (SECONDS - t_start) ))
    if (( left < 25 )); then
        echo "$name skipped: ${left}s of the budget left" | tee -a "$out/summary.txt"
        return
    fi
    (( limit > left )) && limit=$left
    t0=$SECONDS
    timeout -k 5 "$limit" "$@" > "$out/$name.txt" 2>&1
    rc=$?
    echo "$name rc=$rc $(( SECONDS - t0 ))s (limit ${limit}s)" | tee -a "$out/summary.txt"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nvidia-smi topo -m
  python3 -m mpi4py --mpi-library
  python3 -c 'import cupy; from cupy.cuda import nccl; print("cupy", cupy.__version__, "nccl", nccl.get_version())'
  # without the cuDNN frontend (the cudnn13 extra's wheel in .whl), ATTENTION=auto runs the own
  # flash kernels: say which, so runs of two calls are not compared across attentions
  python3 -c 'import cudnn; print("cudnn frontend", cudnn.__version__)' 2>/dev/null \
      || echo "cudnn frontend missing: attention on the own flash kernels"
  git -C "$root" log -1 --format=%h 2>/dev/null; } > "$out/machine.txt" 2>&1

for n in $GPUS; do
    (( n > 1 )) && step "sweep-$n" 60 python3 benchmarks/allreduce_sweep.py --gpus "$n" \
        --out "$out/allreduce-$n.json"
done

MEDIUM=(--config configs/medium.env --precision bf16)
# GPT-2 124M's shape: the medium model at T=1024 with a 50,257-token vocabulary
GPT2=(--config configs/medium.env --precision bf16 --seq-len 1024 --batch-size 16
      --tokenizer bpe --bpe-vocab 50257)
SHORT=(--device gpu --num-epochs 1 --eval-tokens 16384 --log-interval 25)
# train NAME N TREE ARGS...: one `train --gpus N` run of $shape, from TREE's code ("" = this
# tree), started in TREE (`python3 -m` puts the working directory first on the path)
train() {
    local name=$1 n=$2 tree=${3:-$root}
    shift 3
    step "$shape-$name" 90 env -C "$tree" PYTHONPATH="/tmp/site:$tree" python3 -m rustyflow_py train \
        --gpus "$n" "${args[@]}" "${SHORT[@]}" --log-file "$out/$shape.log" \
        --model-path "/tmp/rf-models/$shape-$name.npz" "$@"
}
for shape in $SHAPES; do
    if [[ $shape == medium ]]; then args=("${MEDIUM[@]}"); else args=("${GPT2[@]}"); fi
    for n in $GPUS; do  # first: the 1-GPU step of the plain B is the log's last
        (( n > 1 )) && [[ $shape == medium ]] && train "gpus1-batch$((16 * n))-profile-off" 1 \
            "" --no-profile --batch-size $((16 * n))
    done
    train gpus1-profile-off 1 "" --no-profile
    for n in $GPUS; do
        (( n > 1 )) || continue
        [[ -n $BEFORE ]] && train "gpus$n-before-profile-off" "$n" "$root/$BEFORE" --no-profile
        r=fp32
        for r in $REDUCE; do :; done  # r: the last of them (fp32 when REDUCE is empty)
        for mb in $BUCKETS; do
            [[ $shape == medium ]] && train "gpus$n-$r-bucket$mb-profile-off" "$n" "" \
                --no-profile --grad-reduce-dtype "$r" --bucket-mb "$mb"
        done
        for r in $REDUCE; do
            train "gpus$n-$r-profile-off" "$n" "" --no-profile --grad-reduce-dtype "$r"
        done
        train "gpus$n-$r-profile-on" "$n" "" --profile --grad-reduce-dtype "$r"
    done
    train gpus1-profile-on 1 "" --profile
done

# the model, validated on the runs of each reduce dtype
for shape in $SHAPES; do
    [[ -f $out/$shape.log ]] || continue
    step "model-$shape-fp32" 30 python3 benchmarks/scaling_model.py --record "$out/$shape.log" \
        --sweep "$out"/allreduce-*.json --validate "$out/$shape.log" \
        --json "$out/model-$shape-fp32.json"
    step "model-$shape-bf16" 30 python3 benchmarks/scaling_model.py --record "$out/$shape.log" \
        --sweep "$out"/allreduce-*.json --reduce-bytes 2 --validate "$out/$shape.log" \
        --json "$out/model-$shape-bf16.json"
done
grep -h "RustyFlow run" "$out"/*-profile-*.txt | cut -c1-220
cat "$out/summary.txt"
tail -n 12 "$out/model-medium-fp32.txt" 2>/dev/null
echo "total $(( SECONDS - t_start ))s"
