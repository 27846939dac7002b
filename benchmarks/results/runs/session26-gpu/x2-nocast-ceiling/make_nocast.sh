#!/usr/bin/env bash
# A throwaway tree for one timing only (each rank trains on its own gradient, so the run stays
# finite but is not data parallel): GRAD_REDUCE_DTYPE=bf16 whose buckets
# all-reduce the bf16 wire with no cast and no widening pass, to measure the ceiling of
# "fewer bytes at the source" (#42). Run from the repo root; then on an x2:
#   GPUS=2 EPOCHS=3 VARIANTS="fp32: bf16:--grad-reduce-dtype=bf16 nocast:@.devdata/nocast,--grad-reduce-dtype=bf16" \
#       bash scripts/device/dp_ab.sh
set -e
rm -rf .devdata/nocast && mkdir -p .devdata/nocast
git archive HEAD rustyflow_py configs pyproject.toml | tar -x -C .devdata/nocast
python3 - <<'PY'
p = ".devdata/nocast/rustyflow_py/distributed/data_parallel.py"
s = open(p).read()
old = """            kernels.cast_into(wire, grad)
            collective(wire, stream)
            kernels.cast_into(grad[keep], wire[keep])"""
assert old in s, "Wire.sum changed: adapt the hack"
s = s.replace(old, """            collective(wire, stream)  # TIMING HACK: no cast, no widen (wrong sums)""")
open(p, "w").write(s)
PY
echo "made .devdata/nocast"
