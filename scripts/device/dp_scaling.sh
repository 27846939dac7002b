#!/usr/bin/env bash
# Data-parallel scaling through the user's command, for ONE nvidia-h100-x4 (or h200-x4) call of
# at most 10 minutes (run it with carry [".whl", ".devdata"]):
#   1. the NCCL all-reduce sweep on 2 and 4 GPUs (benchmarks/allreduce_sweep.py);
#   2. `rustyflow train --gpus N --config configs/medium.env --precision bf16` for N = 1, 2, 4,
#      profile off and on, then the GPT-2 124M shape (L12 H12 E768, T=1024, B=16 per GPU,
#      a 50,257-token BPE trained on WikiText-2: GPT-2's own tokenizer files cannot be
#      fetched there), each a short run (MAX_STEPS, 2 epochs at most, 16k evaluated tokens);
#   3. the scaling model on what it measured (benchmarks/scaling_model.py --validate).
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
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$root PYTHONUNBUFFERED=1 RUSTYFLOW_DATA_DIR=${RUSTYFLOW_DATA_DIR:-$root/.devdata}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export RUSTYFLOW_CACHE_DIR=/tmp/rf-cache NCCL_NVLS_ENABLE=0

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
  git -C "$root" log -1 --format=%h 2>/dev/null; } > "$out/machine.txt" 2>&1

for n in 2 4; do
    step "sweep-$n" 60 python3 benchmarks/allreduce_sweep.py --gpus "$n" --out "$out/allreduce-$n.json"
done

MEDIUM=(--config configs/medium.env --precision bf16)
# GPT-2 124M's shape: the medium model at T=1024 with a 50,257-token vocabulary
GPT2=(--config configs/medium.env --precision bf16 --seq-len 1024 --batch-size 16
      --tokenizer bpe --bpe-vocab 50257)
SHORT=(--device gpu --num-epochs 2 --max-steps 200 --eval-tokens 16384 --log-interval 50)
for shape in medium gpt2; do
    if [[ $shape == medium ]]; then args=("${MEDIUM[@]}"); else args=("${GPT2[@]}"); fi
    for profile in off on; do
        for n in 1 2 4; do
            step "$shape-gpus$n-profile-$profile" 75 python3 -m rustyflow_py train --gpus "$n" \
                "${args[@]}" "${SHORT[@]}" --"$([[ $profile == on ]] || echo no-)"profile \
                --log-file "$out/$shape.log" --model-path "/tmp/rf-models/$shape-$n.npz"
        done
    done
done

# the model: validated on the runs (fp32 reduces, as they ran), and predicting bf16 reduces
for shape in medium gpt2; do
    [[ -f $out/$shape.log ]] || continue
    step "model-$shape-fp32" 30 python3 benchmarks/scaling_model.py --record "$out/$shape.log" \
        --sweep "$out"/allreduce-*.json --validate "$out/$shape.log" \
        --json "$out/model-$shape-fp32.json"
    step "model-$shape-bf16" 30 python3 benchmarks/scaling_model.py --record "$out/$shape.log" \
        --sweep "$out"/allreduce-*.json --reduce-bytes 2 --json "$out/model-$shape-bf16.json"
done
grep -h "RustyFlow run" "$out"/*-profile-*.txt | cut -c1-220
cat "$out/summary.txt"
tail -n 12 "$out/model-medium-fp32.txt" 2>/dev/null
echo "total $(( SECONDS - t_start ))s"
