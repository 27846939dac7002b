#!/usr/bin/env bash
# Chat with the model ./train_cpu.sh trained: ./chat_cpu.sh [CONFIG]  (default: config.env).
# The checkpoint is CONFIG's MODEL_PATH with -cpu inserted (-gpu for ./chat_gpu.sh, which runs
# this script); when it is missing, the checkpoints that do exist are listed and the exit
# status is 1. Python: $PYTHON, else the repo's .venv (bootstrapped like the train scripts).
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

# The config is read by the package (python-dotenv, validated), never sourced by the shell.
model="$("$py" - "$config" "$device" <<'PY'
import sys

from rustyflow_py.training.config import ConfigError, load_config

try:
    print(load_config(sys.argv[1])[0].model_path_for(sys.argv[2]))
except ConfigError as exc:
    sys.exit(f"Error: {exc}")
PY
)"

if [[ ! -f "$model" ]]; then
    folder="$(dirname "$model")"
    echo "Error: no $device-trained model at $model (MODEL_PATH of $config)." >&2
    shopt -s nullglob
    found=("$folder"/*.npz)
    if ((${#found[@]})); then
        echo "Checkpoints in $folder/:" >&2
        printf '  %s\n' "${found[@]}" >&2
    else
        echo "No checkpoints in $folder/." >&2
    fi
    echo "Train one with ./train_$device.sh${1:+ $1}, or pass the CONFIG it was trained with." >&2
    exit 1
fi

exec "$py" -m rustyflow_py chat --model "$model" --device "$device" --config "$config"
