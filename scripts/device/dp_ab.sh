#!/usr/bin/env bash
# Settings side by side through the user's command, for ONE multi-GPU call of at most 10
# minutes (carry [".whl", ".devdata"]): for each shape in SHAPES and each N > 1 in GPUS,
# `rustyflow train --gpus N` once per variant in VARIANTS, and once on 1 GPU, EPOCHS epochs
# each with the profile off; then a table of each run's tok/s (the record's, over the whole
# run), its steady tok/s (epochs 2 and later, from the record's epoch times) and their
# speed-ups against the 1-GPU run of the same call, with the ranks' clocks.
#   VARIANTS: space-separated "label:VAR=value,VAR=value" (environment),
#             "label:--flag=value,--flag=value" (train flags) or "label:@DIR" (the tree in
#             DIR, e.g. a `git archive` of the code before a change in .devdata/old, run from
#             there); "default:" is none of them.
# Checkpoints go to /dev/shm and are removed after each run (their writes are not training
# time, but they are most of a short run's wall time on the device's disk).
set -u
t_start=$SECONDS
BUDGET=${BUDGET:-570}
root=$PWD
out=${OUT:-$root/dp-ab-out}
mkdir -p "$out" /dev/shm/rf-ab
source scripts/device/env.sh
export RUSTYFLOW_CACHE_DIR=/tmp/rf-cache
GPUS=${GPUS:-1 2 4}
SHAPES=${SHAPES:-medium gpt2}
EPOCHS=${EPOCHS:-2}
LOG_INTERVAL=${LOG_INTERVAL:-1000}  # 25 for the runs' loss curves
VARIANTS=${VARIANTS:-default:}

MEDIUM=(--config configs/medium.env --precision bf16)
GPT2=(--config configs/medium.env --precision bf16 --seq-len 1024 --batch-size 16
      --tokenizer bpe --bpe-vocab 50257)
COMMON=(--device gpu --num-epochs "$EPOCHS" --warmup-steps 10 --eval-tokens 16384
        --log-interval "$LOG_INTERVAL" --no-profile)

# one NAME N LABEL SPEC: a run, its output in $out/NAME.txt and its record in $out/NAME.log
one() {
    local name=$1 n=$2 spec=$4 left limit envs=() flags=() item rc t0 dir=$root
    left=$(( BUDGET - (SECONDS - t_start) ))
    if (( left < 30 )); then
        echo "$name skipped: ${left}s of the budget left" | tee -a "$out/summary.txt"
        return
    fi
    limit=$(( left < 120 ? left : 120 ))
    IFS=, read -r -a items <<< "$spec"
    for item in "${items[@]}"; do
        [[ -z $item ]] && continue
        if [[ $item == --* ]]; then flags+=("$item")
        elif [[ $item == @* ]]; then dir=$root/${item#@}
        else envs+=("$item"); fi
    done
    t0=$SECONDS
    (cd "$dir" && timeout -k 5 "$limit" env "${envs[@]}" PYTHONPATH="/tmp/site:$dir" \
        python3 -m rustyflow_py train --gpus "$n" "${args[@]}" "${COMMON[@]}" "${flags[@]}" \
        --log-file "$out/$name.log" --model-path "/dev/shm/rf-ab/$name.npz") \
        > "$out/$name.txt" 2>&1
    rc=$?
    rm -f /dev/shm/rf-ab/*
    echo "$name rc=$rc $(( SECONDS - t0 ))s" | tee -a "$out/summary.txt"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import cupy; from cupy.cuda import nccl; print("cupy", cupy.__version__, "nccl", nccl.get_version())'
  # without the cuDNN frontend (the cudnn13 extra's wheel in .whl), ATTENTION=auto runs the own
  # flash kernels: say which, so runs of two calls are not compared across attentions
  python3 -c 'import cudnn; print("cudnn frontend", cudnn.__version__)' 2>/dev/null \
      || echo "cudnn frontend missing: attention on the own flash kernels"
} > "$out/machine.txt" 2>&1

for shape in $SHAPES; do
    if [[ $shape == medium ]]; then args=("${MEDIUM[@]}"); else args=("${GPT2[@]}"); fi
    one "$shape-gpus1" 1 default ""
    for n in $GPUS; do
        (( n > 1 )) || continue
        for v in $VARIANTS; do
            one "$shape-gpus$n-${v%%:*}" "$n" "${v%%:*}" "${v#*:}"
        done
    done
done

python3 - "$out" <<'EOF' | tee "$out/table.md"
import glob, json, os, re, sys
out = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(out, "*.log"))):
    found = re.findall(r"\[RUN_JSON\] (.*)", open(path).read())
    if found:
        rows[os.path.basename(path)[:-4]] = json.loads(found[-1])


def steady(name, r):
    """tok/s of epochs 2 and later: from the record's unrounded epoch times, or (an older
    tree's record has none) the console's epoch lines, which print two decimals."""
    times = (r.get("epoch_times_s") or [])[1:]
    if not times:
        text = open(os.path.join(out, name + ".txt")).read()
        times = [float(t) for k, t in re.findall(r"^epoch (\d+)/\d+: ([\d.]+)s", text, re.M)
                 if int(k) > 1]
    m, par = r.get("model") or {}, r.get("parallel") or {}
    tokens = (r.get("steps_per_epoch") or 0) * (par.get("world_size") or 1) * \
        m.get("batch", 0) * m.get("seq_len", 0)
    return tokens * len(times) / sum(times) if times and sum(times) > 0 else float("nan")


print("| run | status | tok/s | speed-up | steady tok/s (epochs 2+) | steady speed-up "
      "| rank clocks (s), min..max |")
print("|---|---|---:|---:|---:|---:|---|")
for name, r in rows.items():
    bname = name.split("-gpus")[0] + "-gpus1"
    base = rows.get(bname)
    tps = r.get("tokens_per_s") or 0
    up = tps / base["tokens_per_s"] if base and base.get("tokens_per_s") else float("nan")
    st = steady(name, r)
    st_up = st / steady(bname, base) if base else float("nan")
    clocks = [x["steps_time_s"] for x in (r.get("parallel") or {}).get("ranks") or []]
    spread = f"{min(clocks):.3f}..{max(clocks):.3f}" if clocks else ""
    print(f"| {name} | {r['status']} | {tps:,.0f} | {up:.3f}x | {st:,.0f} | {st_up:.3f}x "
          f"| {spread} |")
EOF
cat "$out/summary.txt"
echo "total $(( SECONDS - t_start ))s"
