#!/usr/bin/env bash
# Make sure ./.venv holds rustyflow-py (editable install) and print that venv's python.
#
#   scripts/bootstrap.sh [--gpu] [--jit] [EXTRA ...]      e.g. scripts/bootstrap.sh dev
#
# Shared by train_cpu.sh, train_gpu.sh and test.sh, so "works on a fresh machine" lives in one
# place. The first run creates .venv and runs `pip install -e .[EXTRAS]`; later runs only
# compare a stamp (pyproject.toml's hash and the extras installed) and return at once. The
# python path is the only thing written to stdout; progress goes to stderr.
#
# --gpu: also install CuPy (the extra matching the driver's CUDA major version) when
# nvidia-smi exists and cupy does not import. A failed install is not an error: the trainer
# then falls back to the CPU with a warning that says why.
#
# --jit: also install numba (the jit extra: compiled CPU kernels) when it does not import. A
# failed install is not an error either: the CPU kernels then run their NumPy formulation.
#
# RUSTYFLOW_PYTHON=/path/to/python skips all of this and uses that interpreter as it is (it
# must already import rustyflow_py). RUSTYFLOW_BOOTSTRAP_PYTHON is the interpreter that
# creates .venv (default: python3).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "bootstrap: $*" >&2; }
fail() { echo "Error: $*" >&2; }  # the one error prefix the package prints too

if [[ -n "${RUSTYFLOW_PYTHON:-}" ]]; then
    echo "$RUSTYFLOW_PYTHON"
    exit 0
fi

# An extra name as pip accepts it (PEP 685): anything else, an empty string above all, would
# make the spec malformed (`.[,dev]`), so it is refused here and dropped from an old stamp.
is_extra() { [[ $1 =~ ^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$ ]]; }

gpu=0
jit=0
extras=()
for arg in "$@"; do
    case $arg in
        --gpu) gpu=1 ;;
        --jit) jit=1 ;;
        *)
            if ! is_extra "$arg"; then
                fail "not an option or an extra name: '$arg' (usage: [--gpu] [--jit] [EXTRA ...])"
                exit 2
            fi
            extras+=("$arg")
            ;;
    esac
done

venv="$root/.venv"
py="$venv/bin/python"
stamp="$venv/.rustyflow-bootstrap"
hash="$(cksum <"$root/pyproject.toml" | cut -d' ' -f1)"

sorted_unique() {  # the arguments sorted, once each, one a line; nothing at all for none
    if [[ $# -gt 0 ]]; then printf '%s\n' "$@" | LC_ALL=C sort -u; fi
}

# The extras an existing stamp records (its lines after the hash). Blank, padded or malformed
# lines are skipped: an older bootstrap wrote an empty line there, which must heal, not fail.
recorded=()
if [[ -f $stamp ]]; then
    while IFS= read -r line || [[ -n $line ]]; do
        line="${line#"${line%%[![:space:]]*}"}"
        line="${line%"${line##*[![:space:]]}"}"
        if is_extra "$line"; then recorded+=("$line"); fi
    done < <(tail -n +2 "$stamp")
fi

write_stamp() {  # hash, then the extras: never an empty line; replaced in one rename
    { echo "$hash"; sorted_unique "$@"; } >"$stamp.tmp"
    mv -f "$stamp.tmp" "$stamp"
}

recorded_has() {  # is $1 among the extras the stamp records?
    local extra
    for extra in ${recorded[@]+"${recorded[@]}"}; do
        if [[ $extra == "$1" ]]; then return 0; fi
    done
    return 1
}

installed() {  # is every requested extra recorded for this pyproject.toml?
    [[ -x $py && -f $stamp ]] || return 1
    [[ "$(head -n 1 "$stamp")" == "$hash" ]] || return 1
    local extra
    for extra in ${extras[@]+"${extras[@]}"}; do
        recorded_has "$extra" || return 1
    done
    "$py" -c 'import rustyflow_py' 2>/dev/null
}

if ! installed; then
    if ! "$py" -c 'import sys' 2>/dev/null; then
        base="${RUSTYFLOW_BOOTSTRAP_PYTHON:-python3}"
        if ! "$base" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            fail "need Python 3.10+ to create .venv; '$base' is not: set RUSTYFLOW_BOOTSTRAP_PYTHON"
            exit 1
        fi
        say "creating $venv (first run only)"
        "$base" -m venv --clear "$venv"
    fi
    # Keep the extras installed earlier (test.sh's dev) when a train script reinstalls.
    all=(${extras[@]+"${extras[@]}"} ${recorded[@]+"${recorded[@]}"})
    spec="$root"
    if [[ ${#all[@]} -gt 0 ]]; then
        spec="${root}[$(sorted_unique "${all[@]}" | paste -sd, -)]"
    fi
    say "installing rustyflow-py${spec#"$root"} into .venv (pip install -e)"
    "$py" -m pip install --quiet --disable-pip-version-check -e "$spec" >&2
    write_stamp ${all[@]+"${all[@]}"}
elif ! cmp -s "$stamp" <(echo "$hash"; sorted_unique ${recorded[@]+"${recorded[@]}"}); then
    write_stamp ${recorded[@]+"${recorded[@]}"}  # satisfied, but the stamp had stray lines
fi

gave_up="$venv/.rustyflow-cupy-failed"  # one failed CuPy install is not retried every run
if [[ $gpu == 1 ]] && command -v nvidia-smi >/dev/null 2>&1 && [[ ! -f $gave_up ]] \
        && ! "$py" -c 'import cupy' 2>/dev/null; then
    cuda="$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)"
    extra=cuda13
    if [[ -n $cuda && $cuda -lt 13 ]]; then extra=gpu; fi  # cupy-cuda12x for 12.x drivers
    say "nvidia-smi found (CUDA ${cuda:-?}) but CuPy is missing: pip install -e .[$extra]"
    if ! "$py" -m pip install --quiet --disable-pip-version-check -e "${root}[$extra]" >&2; then
        touch "$gave_up"
        say "could not install CuPy: training falls back to the CPU (delete $gave_up to retry)"
    fi
fi

no_jit="$venv/.rustyflow-numba-failed"
if [[ $jit == 1 && ! -f $no_jit ]] && ! "$py" -c 'import numba' 2>/dev/null; then
    say "installing numba for the compiled CPU kernels: pip install -e .[jit]"
    if ! "$py" -m pip install --quiet --disable-pip-version-check -e "${root}[jit]" >&2; then
        touch "$no_jit"
        say "could not install numba: the CPU kernels use NumPy (delete $no_jit to retry)"
    fi
fi

echo "$py"
