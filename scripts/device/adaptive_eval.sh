#!/usr/bin/env bash
# Adaptive evaluation of the quality recipe, in ONE call of at most 10 minutes (carry [".whl",
# ".devdata"]): train configs/wikitext2-quality.env alone (SEED), tune `eval --adapt` on the
# first TUNE validation tokens (benchmarks/adaptive_sweep.py, its processes side by side: the
# evaluations are launch-bound), then `eval --adapt` with the best settings on the whole
# validation and test splits through the command, and plain `eval` at other strides.
# Everything lands in $OUT/adaptive.tgz.
set -u
root=$PWD
out=${OUT:-$root/adaptive-out}
work=/dev/shm/rf-adapt
rm -rf "$work"  # a warm machine keeps /dev/shm: start clean
mkdir -p "$out" "$work/logs"
source scripts/device/env.sh
export RUSTYFLOW_CACHE_DIR=/tmp/rf-cache
SEED=${SEED:-1337}
# extra train flags (quality-h200.md's model: "--num-layers 6 --dropout 0.15", the recipe of
# its day), and the seconds training may take (the 24-layer recipe: about 6 minutes alone on
# an H100, which leaves too little of one call for the default grids)
TRAIN_FLAGS=${TRAIN_FLAGS:-}
TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-420}
TUNE=${TUNE:-30000}
# grids: space-separated, each "key=v1,v2|key=v3" (| between a grid's axes)
CACHE_GRIDS=${CACHE_GRIDS:-"window=2000|theta=0.005,0.01,0.02,0.05,0.1|lambda=0.05,0.1,0.2,0.3"}
DYNAMIC_GRIDS=${DYNAMIC_GRIDS:-"lr=0.003,0.01,0.03,0.1|segment=32 lr=0.01,0.03,0.1,0.3|segment=128"}
STRIDES=${STRIDES:-"64 32"}
finish() { cp "$work"/logs/adapt-*.out "$out"/ 2>/dev/null; tar -C "$work" -czf "$out/adaptive.tgz" logs; }
trap finish EXIT
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$work/logs/gpu.txt"

ckpt=$work/q.npz
best=$work/q-best.npz
# shellcheck disable=SC2086
( time timeout "$TRAIN_TIMEOUT" python3 -m rustyflow_py train --device gpu \
    --config configs/wikitext2-quality.env $TRAIN_FLAGS --seed "$SEED" --model-path "$ckpt" \
    --log-file "$work/logs/train.log" ) \
    > "$work/logs/train.out" 2>&1
tail -3 "$work/logs/train.out"
[ -f "$best" ] || { echo "no best checkpoint"; exit 1; }

# tuning on validation, each grid in a process of its own, side by side
i=0
for method in cache dynamic; do
    grids=CACHE_GRIDS; [ $method = dynamic ] && grids=DYNAMIC_GRIDS
    for g in ${!grids}; do
        i=$((i + 1))
        timeout 130 python3 benchmarks/adaptive_sweep.py --model "$best" --device gpu \
            --eval-tokens "$TUNE" --$method "${g//|/ }" --out "$work/logs/sweep-$i.md" \
            > "$work/logs/sweep-$i.out" 2>&1 &
    done
done
for s in $STRIDES; do
    for split in valid test; do
        timeout 130 python3 -m rustyflow_py eval --model "$best" --device gpu --split $split \
            --eval-stride "$s" > "$work/logs/eval-$split-stride$s.out" 2>&1 &
    done
done
wait
cat "$work"/logs/sweep-*.md "$work"/logs/eval-*.out

# the best of each method (the lowest validation perplexity over its sweeps)
pick() { grep -h "^| $1 " "$work"/logs/sweep-*.md | sort -t'|' -k4 -g | head -1 | cut -d'|' -f3; }
for method in cache dynamic; do
    settings=$(pick $method)
    [ -n "$settings" ] || continue
    echo "best $method: $settings" | tee -a "$work/logs/best.txt"
    for split in valid test; do
        # shellcheck disable=SC2086
        timeout 230 python3 -m rustyflow_py eval --model "$best" --device gpu --split $split \
            --adapt $method $settings > "$work/logs/adapt-$method-$split.out" 2>&1 &
    done
done
wait
tail -n 3 "$work"/logs/adapt-*.out
