#!/usr/bin/env bash
# Run the checks: ruff, then the test suite.   ./test.sh [pytest args...]
#
# The first run creates .venv with the package and its dev extra (pytest, ruff); later runs
# reuse it. RUSTYFLOW_WITH_TORCH=1 also installs torch==2.13.0 for the PyTorch parity tests
# and transformers==5.17.0 for the Hugging Face GPT-2 parity tests (they skip without them). Tests that need the real WikiText-2 read $RUSTYFLOW_DATA_DIR, which
# defaults to ../shared/data when that folder exists, and skip with a reason otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

py="$(scripts/bootstrap.sh --jit dev mpi)"  # numba: its kernels are tested against NumPy's;
# mpi: the data-parallel tests run real ranks under mpiexec
if [[ ${RUSTYFLOW_WITH_TORCH:-0} == 1 ]] && ! "$py" -c 'import torch' 2>/dev/null; then
    echo "test.sh: installing torch==2.13.0 for the parity tests (first run only)" >&2
    "$py" -m pip install --quiet --disable-pip-version-check torch==2.13.0 >&2
fi
if [[ ${RUSTYFLOW_WITH_TORCH:-0} == 1 ]] && ! "$py" -c 'import transformers' 2>/dev/null; then
    echo "test.sh: installing transformers==5.17.0 for the GPT-2 parity tests (first run only)" >&2
    "$py" -m pip install --quiet --disable-pip-version-check transformers==5.17.0 >&2
fi

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
