#!/usr/bin/env bash
# Chat on the GPU with a model you trained: ./chat_gpu.sh [CONFIG] [OPTIONS], in any order.
# Same as ./chat_cpu.sh (the same choice of model: any checkpoint loads on either device),
# on the GPU, its checkpoint (-gpu) looked for first when the log names none.
set -euo pipefail

RUSTYFLOW_CHAT_DEVICE=gpu exec "$(dirname "${BASH_SOURCE[0]}")/chat_cpu.sh" "$@"
