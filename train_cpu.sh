#!/usr/bin/env bash
# Train on the CPU (NumPy):  ./train_cpu.sh [CONFIG] [rustyflow train options...] (in any order)
#
# Reads CONFIG (default: ./config.env) through the package, prints a banner, runs
# `rustyflow train --device cpu` in the folder you are in and exits with its status. The first
# run creates .venv.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/scripts/train.sh" cpu "$@"
