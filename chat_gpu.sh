#!/usr/bin/env bash
# Chat on the GPU with the model ./train_gpu.sh trained: ./chat_gpu.sh [CONFIG]
# (default: config.env). Same as ./chat_cpu.sh, for the -gpu checkpoint and device.
set -euo pipefail

RUSTYFLOW_CHAT_DEVICE=gpu exec "$(dirname "${BASH_SOURCE[0]}")/chat_cpu.sh" "$@"
