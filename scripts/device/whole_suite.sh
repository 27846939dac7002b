#!/usr/bin/env bash
# The whole suite on the device, a GPU present (the chat-script tests need the checkout's
# .venv, which the device does not have: deselected).
set -u
source scripts/device/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee ${OUT:-.}/gpu.txt
timeout 520 python3 -m pytest -q -p no:cacheprovider tests -k "not chat_script" 2>&1 | tee ${OUT:-.}/suite.txt | tail -40
