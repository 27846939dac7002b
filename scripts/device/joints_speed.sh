#!/usr/bin/env bash
# The engine-joints refactor's speed check, old tree against new in one lease: the graph rows of
# vs_pytorch.py in each tree, alternated twice and pinned to two cores, then the eager step of
# both trees in one process (benchmarks/eager_ab.py). The old tree is `.before/`, a git archive
# of the commit before the refactor (git-ignored: make it with
# `mkdir .before && git archive <rev> | tar -x -C .before`, and carry it).
set -u
source scripts/device/env.sh
out=${OUT:-.}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
rows="--device gpu --shapes seed,small --precisions tf32,bf16 --skip-compile --skip-eager --curve-steps 0 --windows 5"
for round in ${ROUNDS:-1 2}; do
  for tree in before after; do
    dir=$PWD; [ "$tree" = before ] && dir=$PWD/.before
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir taskset -c 6,7 timeout 150 python3 benchmarks/vs_pytorch.py $rows \
      --out "$out/graph-$tree-$round.md" > "$out/graph-$tree-$round.log" 2>&1)
    echo "$tree $round rc=$?"; grep -i "graph" "$out/graph-$tree-$round.md" | head -8
  done
done
PYTHONPATH=/tmp/site:$PWD timeout 200 python3 benchmarks/eager_ab.py .before --pairs 16 2>&1 | tee "$out/eager-ab.txt"
