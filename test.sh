#!/usr/bin/env bash
# Run the checks: ruff, then the test suite.   ./test.sh [pytest args...]
#
# The first run creates .venv with the package and its dev extra (pytest, ruff); later runs
# reuse it. RUSTYFLOW_WITH_TORCH=1 also installs the parity extra (torch for the PyTorch
# parity tests, transformers for the Hugging Face GPT-2 ones): they skip without them, except
# that with RUSTYFLOW_WITH_TORCH=1 a missing one fails (tests/test_parity_deps.py), so CI
# cannot pass with them skipped. Tests that need the real WikiText-2 read $RUSTYFLOW_DATA_DIR,
# which defaults to ../shared/data when that folder exists, and skip with a reason otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# numba: its kernels are tested against NumPy's; mpi: the data-parallel tests run real ranks
# under mpiexec
extras=(dev mpi)
if [[ ${RUSTYFLOW_WITH_TORCH:-0} == 1 ]]; then extras+=(parity); fi
py="$(scripts/bootstrap.sh --jit "${extras[@]}")"

if [[ -z ${RUSTYFLOW_DATA_DIR:-} && -d ../shared/data ]]; then
    RUSTYFLOW_DATA_DIR=../shared/data
fi
if [[ -n ${RUSTYFLOW_DATA_DIR:-} && -d $RUSTYFLOW_DATA_DIR ]]; then
    # Absolute, because tests run in temporary folders.
    RUSTYFLOW_DATA_DIR="$(cd "$RUSTYFLOW_DATA_DIR" && pwd)"
    export RUSTYFLOW_DATA_DIR
fi

lint=()
for path in rustyflow_py tests benchmarks; do
    if [[ -e $path ]]; then lint+=("$path"); fi
done
"$py" -m ruff check "${lint[@]}"
exec "$py" -m pytest -q "$@"
