#!/usr/bin/env bash
# The body of train_cpu.sh and train_gpu.sh:  scripts/train.sh cpu|gpu [CONFIG] [TRAIN OPTIONS]
#
# Runs in the folder you are in, like every rustyflow command: a relative CONFIG, DATA_DIR,
# LOG_FILE or MODEL_PATH is relative to it, and no CONFIG means ./config.env when present.
# The arguments go to `rustyflow train` as they are (CONFIG and options in any order).
# Bootstraps .venv on first use, prints the banner (with the config's warnings; the later
# steps do not repeat them), then replaces itself with
# `rustyflow train --device DEVICE ARGS...`, so the exit status (130 on Ctrl-C) and signals
# are the trainer's own. Nothing here needs a terminal.
set -euo pipefail

device="$1"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# hints name the command that works from here: ./rustyflow in the checkout, else its path
[[ $root == "$PWD" ]] && wrapper=./rustyflow || wrapper="$root/rustyflow"
export RUSTYFLOW_COMMAND="${RUSTYFLOW_COMMAND:-$wrapper}"

bootstrap=(--jit)  # numba: the compiled CPU kernels
if [[ $device == gpu ]]; then bootstrap=(--gpu); fi
py="$("$root/scripts/bootstrap.sh" ${bootstrap[@]+"${bootstrap[@]}"})"

export PYTHONUNBUFFERED=1  # lines reach a pipe or log file as they are printed
args=(--device "$device" "$@")
"$py" -m rustyflow_py banner "${args[@]}"
export RUSTYFLOW_CONFIG_WARNED=1  # the banner has printed the config's warnings
if [[ $device == gpu ]]; then
    # compile the GPU kernels into CuPy's disk cache first (quick when it is warm), so that the
    # run's own start-up and first epoch are not slowed by compilation; a failure here is the
    # trainer's to report, so it is not fatal
    "$py" -m rustyflow_py warmup "${args[@]}" || true
fi
exec "$py" -m rustyflow_py train "${args[@]}"
