#!/usr/bin/env bash
# Chat with the model ./train_cpu.sh trained: ./chat_cpu.sh [CONFIG]  (default: config.env).
# `rustyflow chat` finds the checkpoint: CONFIG's MODEL_PATH with -cpu inserted (-gpu for
# ./chat_gpu.sh, which runs this script), else the other device's; when neither exists it
# names the checkpoints that do and exits 1. Python: $PYTHON, else the repo's .venv
# (bootstrapped like the train scripts).
set -euo pipefail

device="${RUSTYFLOW_CHAT_DEVICE:-cpu}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
config="${1:-$root/config.env}"
[[ "$config" == /* ]] || config="$PWD/$config"  # before the cd below
if [[ -n "${PYTHON:-}" ]]; then
    py="$PYTHON"
else  # the same .venv the train scripts bootstrap (created on first use)
    bootstrap=()
    if [[ $device == gpu ]]; then bootstrap=(--gpu); fi
    py="$("$root/scripts/bootstrap.sh" ${bootstrap[@]+"${bootstrap[@]}"})"
fi
cd "$root"  # relative MODEL_PATHs are relative to the repo, as for the train scripts

exec "$py" -m rustyflow_py chat --device "$device" --config "$config"
