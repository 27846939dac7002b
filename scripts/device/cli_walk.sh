#!/usr/bin/env bash
# A user's commands on the GPU: the quick config trained, the same command again (the earlier
# run's files replaced only as this run writes its own), eval, generate, chat, and a resume on
# changed data.
set -u
source scripts/device/env.sh
root=$PWD
w=$(mktemp -d); cd "$w"
rf() { echo "\$ rustyflow $*"; python3 -m rustyflow_py "$@"; echo "rc=$?"; }
rf train "$root/configs/quick.env" --device gpu 2>&1 | grep -E "Checkpoint:|INFO|WARN|Error|RustyFlow run|rc="
sha256sum models/*.npz
rf train "$root/configs/quick.env" --device gpu 2>&1 | grep -E "Checkpoint:|INFO|WARN|Error|rc="
sha256sum models/*.npz
rf eval --model models/quick-gpu-best.npz --device gpu 2>&1 | tail -2
rf generate --config "$root/configs/quick.env" --prompt "The game" --max-tokens 32 --device gpu 2>&1 | tail -4
printf 'the game\nexit\n' | rf chat --config "$root/configs/quick.env" --max-tokens 16 --device gpu 2>&1 | tail -5
mkdir -p d && cp -r "$RUSTYFLOW_DATA_DIR/wikitext-2" d/ && sed -i '100{h;d};101{G}' d/wikitext-2/train.txt
rf train "$root/configs/quick.env" --device gpu --data-dir d --resume models/quick-gpu.npz --max-steps 70 2>&1 | grep -E "Error|rc="
