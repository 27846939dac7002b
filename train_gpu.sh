#!/usr/bin/env bash
# Train on an NVIDIA GPU (CuPy):  ./train_gpu.sh [CONFIG] [rustyflow train options...]
# (CONFIG and options in any order).
#
# Like train_cpu.sh with `--device gpu`. The first run also installs CuPy when nvidia-smi is
# present; without a usable GPU the trainer itself warns and falls back to the CPU (add
# --strict-device to make that an error instead).
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/scripts/train.sh" gpu "$@"
