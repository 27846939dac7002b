#!/usr/bin/env bash
# Chat with a model you trained: ./chat_cpu.sh [CONFIG] [OPTIONS], in any order; OPTIONS are
# `rustyflow chat`'s (--model CKPT, --temperature T, --max-tokens N, ...). ./chat_gpu.sh runs
# this script for the GPU.
#
# Without --model, `rustyflow chat` takes the latest completed run of the log (LOG_FILE,
# training_log.txt by default; of CONFIG's runs when CONFIG is given): its best checkpoint,
# else its final one; with no such run, CONFIG's MODEL_PATH with -cpu (-gpu) inserted; and it
# says which on stderr. It runs in the folder you are in, like every rustyflow command: the
# log, CONFIG and the checkpoints are looked for relative to it. Python: $PYTHON, else the
# repo's .venv (bootstrapped like the train scripts).
set -euo pipefail

device="${RUSTYFLOW_CHAT_DEVICE:-cpu}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# hints name the command that works from here: ./rustyflow in the checkout, else its path
[[ $root == "$PWD" ]] && wrapper=./rustyflow || wrapper="$root/rustyflow"
export RUSTYFLOW_COMMAND="${RUSTYFLOW_COMMAND:-$wrapper}"

typed=""  # the config as the caller named it (CONFIG or --config), to refuse a second one
config=()
args=()
one_config() {
    if [[ -n $typed ]]; then
        echo "Error: two configs given ($typed and $1): pass one" >&2
        exit 1
    fi
    typed="$1"
    config=(--config "$1")
}
while [[ $# -gt 0 ]]; do
    case $1 in
        --quiet | -h | --help) args+=("$1") ;;  # chat's only options without a value
        --config=*) one_config "${1#*=}" ;;
        --*=*) args+=("$1") ;;
        --config)
            if [[ $# -lt 2 ]]; then args+=("$1"); break; fi  # chat says what is missing
            one_config "$2"
            shift
            ;;
        -*)
            args+=("$1")
            if [[ $# -gt 1 ]]; then args+=("$2"); shift; fi
            ;;
        *) one_config "$1" ;;
    esac
    shift
done

if [[ -n "${PYTHON:-}" ]]; then
    py="$PYTHON"
else  # the same .venv the train scripts bootstrap (created on first use)
    bootstrap=()
    if [[ $device == gpu ]]; then bootstrap=(--gpu); fi
    py="$("$root/scripts/bootstrap.sh" ${bootstrap[@]+"${bootstrap[@]}"})"
fi
exec "$py" -m rustyflow_py chat --device "$device" ${config[@]+"${config[@]}"} \
    ${args[@]+"${args[@]}"}
