#!/usr/bin/env bash
# The body of train_cpu.sh and train_gpu.sh:  scripts/train.sh cpu|gpu [CONFIG] [TRAIN OPTIONS]
#
# Runs from the repository root (so config.env, data/, models/ and training_log.txt are the
# repository's), bootstraps .venv on first use, prints the banner, then replaces itself with
# `rustyflow train --device DEVICE --config CONFIG OPTIONS...`, so the exit status (130 on
# Ctrl-C) and signals are the trainer's own. Nothing here needs a terminal.
set -euo pipefail

device="$1"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

config=()
if [[ $# -gt 0 && $1 != -* ]]; then  # CONFIG, made absolute before leaving the caller's folder
    file="$1"
    shift
    if [[ -d "$(dirname "$file")" ]]; then
        file="$(cd "$(dirname "$file")" && pwd)/$(basename "$file")"
    fi
    config=(--config "$file")
elif [[ -f "$root/config.env" ]]; then
    config=(--config "$root/config.env")
fi
cd "$root"

bootstrap=(--jit)  # numba: the compiled CPU kernels
if [[ $device == gpu ]]; then bootstrap=(--gpu); fi
py="$(scripts/bootstrap.sh ${bootstrap[@]+"${bootstrap[@]}"})"

export PYTHONUNBUFFERED=1  # lines reach a pipe or log file as they are printed
args=(--device "$device" ${config[@]+"${config[@]}"} "$@")
"$py" -m rustyflow_py banner "${args[@]}"
if [[ $device == gpu ]]; then
    # compile the GPU kernels into CuPy's disk cache first (quick when it is warm), so that the
    # run's own start-up and first epoch are not slowed by compilation; a failure here is the
    # trainer's to report, so it is not fatal
    "$py" -m rustyflow_py warmup "${args[@]}" || true
fi
exec "$py" -m rustyflow_py train "${args[@]}"
