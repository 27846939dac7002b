"""scripts/bootstrap.sh: every order of the scripts' calls leaves a usable .venv and a clean stamp.

The README's two commands share .venv through bootstrap.sh, in either order, and an empty
extra once broke the second one (`pip install -e .[,dev]`). A real pip install per order is
far too slow for CI, so the real script runs against a fake interpreter: its `-m venv` makes
a .venv whose bin/python is a shell stub that logs every pip command line it is given.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The calls the scripts make: chat_cpu.sh (nothing), train_cpu.sh (--jit), a bare `dev`, and
# test.sh (--jit dev).
CALLS: dict[str, tuple[str, ...]] = {
    "none": (),
    "jit": ("--jit",),
    "dev": ("dev",),
    "jit+dev": ("--jit", "dev"),
}
ORDERS = list(itertools.permutations(CALLS))

# The interpreter that creates .venv: the version check passes, `-m venv [--clear] DIR` makes
# DIR/bin/python, a copy of the stub below.
FAKE_BASE = """#!/usr/bin/env bash
case $1 in
    -c) exit 0 ;;
    -m)
        [[ $2 == venv ]] || exit 99
        shift 2
        if [[ $1 == --clear ]]; then shift; rm -rf "$1"; fi
        mkdir -p "$1/bin"
        cp "{stub}" "$1/bin/python"
        chmod +x "$1/bin/python"
        ;;
    *) exit 99 ;;
esac
"""

# The venv's python: imports answer from marker files that its fake pip writes; each pip
# command line is logged (arguments tab-separated); anything unexpected is logged and fails.
FAKE_VENV_PYTHON = r"""#!/usr/bin/env bash
venv="$(cd "$(dirname "$0")/.." && pwd)"
case "$1 ${2-}" in
    "-c import sys") exit 0 ;;
    "-c import rustyflow_py") [[ -f $venv/.fake-installed ]]; exit ;;
    "-c import numba") [[ -f $venv/.fake-numba ]]; exit ;;
    "-c import cupy") exit 1 ;;
    "-m rustyflow_py")
        shift 2
        echo "rustyflow $* (in $PWD)"
        exit 0
        ;;
    "-m pip")
        shift 2
        (IFS=$'\t'; echo "$*") >>"$venv/.fake-pip.log"
        spec="${!#}"
        touch "$venv/.fake-installed"
        if [[ $spec =~ [[,]jit[],] ]]; then touch "$venv/.fake-numba"; fi
        exit 0
        ;;
esac
echo "$*" >>"$venv/.fake-unexpected"
exit 99
"""


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A throwaway copy of what bootstrap.sh reads: the script itself and pyproject.toml."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "bootstrap.sh", root / "scripts" / "bootstrap.sh")
    shutil.copy2(REPO / "rustyflow", root / "rustyflow")
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment with the fake interpreter as RUSTYFLOW_BOOTSTRAP_PYTHON."""
    stub = _executable(tmp_path / "fake-venv-python", FAKE_VENV_PYTHON)
    base = _executable(tmp_path / "fake-python3", FAKE_BASE.replace("{stub}", str(stub)))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RUSTYFLOW_")}
    environ["RUSTYFLOW_BOOTSTRAP_PYTHON"] = str(base)
    return environ


def bootstrap(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / "scripts" / "bootstrap.sh"), *args],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )


def pyproject_hash(root: Path) -> str:
    """The first stamp line, computed as the script does (POSIX cksum)."""
    with (root / "pyproject.toml").open("rb") as f:
        out = subprocess.run(["cksum"], stdin=f, capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def pip_specs(root: Path) -> list[str]:
    """The `pip install -e SPEC` targets logged so far, in order."""
    log = root / ".venv" / ".fake-pip.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split("\t")[-1] for line in lines]


def spec_extras(root: Path, spec: str) -> set[str]:
    """The extras of a spec, after checking it is `ROOT` or `ROOT[a,b]` with real names."""
    assert not any(bad in spec for bad in ("[,", ",]", ",,", "[]")), spec
    match = re.fullmatch(re.escape(str(root)) + r"(?:\[([A-Za-z0-9._,-]+)\])?", spec)
    assert match, f"malformed pip spec: {spec!r}"
    names = match.group(1).split(",") if match.group(1) else []
    assert all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", n) for n in names), spec
    return set(names)


def stamp_extras(root: Path) -> set[str]:
    """The extras in the stamp, after checking it is the hash plus one name a line."""
    text = (root / ".venv" / ".rustyflow-bootstrap").read_text()
    assert text.endswith("\n"), repr(text)
    lines = text[:-1].split("\n")
    assert all(line.strip() for line in lines), f"empty line in the stamp: {text!r}"
    assert lines[0] == pyproject_hash(root)
    assert lines[1:] == sorted(set(lines[1:])), f"stamp extras not sorted/unique: {text!r}"
    return set(lines[1:])


def check_ok(root: Path, result: subprocess.CompletedProcess[str]) -> None:
    """Exit 0, and stdout is exactly the venv's python: the callers capture it with $(...)."""
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{root / '.venv' / 'bin' / 'python'}\n", result.stdout
    assert not (root / ".venv" / ".fake-unexpected").exists()


@pytest.mark.parametrize("order", ORDERS, ids=["-".join(order) for order in ORDERS])
def test_every_order_of_calls(clone: Path, env: dict[str, str], order: tuple[str, ...]) -> None:
    """Any order leaves well-formed specs and a stamp with the union of the extras asked for."""
    wanted: set[str] = set()
    numba = False
    for name in order:
        args = CALLS[name]
        before = len(pip_specs(clone))
        first = not (clone / ".venv").exists()
        new = {a for a in args if not a.startswith("--")} - wanted
        check_ok(clone, bootstrap(clone, env, *args))
        wanted |= new
        specs = pip_specs(clone)[before:]
        extras = [spec_extras(clone, spec) for spec in specs]
        expected = [wanted] if first or new else []  # later runs with nothing new: no pip
        if "--jit" in args and not numba and not any("jit" in e for e in expected):
            expected.append({"jit"})
        assert extras == expected, (name, specs)
        numba = numba or any("jit" in e for e in extras)
        assert stamp_extras(clone) == wanted, name


def test_old_broken_stamp_heals_when_installing(clone: Path, env: dict[str, str]) -> None:
    """The stamp an older train_cpu.sh left (hash + an empty line) gives `[dev]`, not `[,dev]`."""
    check_ok(clone, bootstrap(clone, env, "--jit"))
    stamp = clone / ".venv" / ".rustyflow-bootstrap"
    stamp.write_text(f"{pyproject_hash(clone)}\n\n")
    before = len(pip_specs(clone))
    check_ok(clone, bootstrap(clone, env, "--jit", "dev"))
    assert [spec_extras(clone, s) for s in pip_specs(clone)[before:]] == [{"dev"}]
    assert stamp_extras(clone) == {"dev"}


def test_stray_stamp_lines_are_dropped_without_reinstalling(
    clone: Path, env: dict[str, str]
) -> None:
    """Blank, padded or malformed stamp lines are cleaned up even when nothing is to install."""
    check_ok(clone, bootstrap(clone, env, "dev"))
    stamp = clone / ".venv" / ".rustyflow-bootstrap"
    stamp.write_text(f"{pyproject_hash(clone)}\n\n  dev \t\n \n[,dev]\n\n")
    before = len(pip_specs(clone))
    check_ok(clone, bootstrap(clone, env))
    check_ok(clone, bootstrap(clone, env, "dev"))
    assert pip_specs(clone)[before:] == []
    assert stamp_extras(clone) == {"dev"}


@pytest.mark.parametrize("arg", ["", " ", "--bogus", "a,b", "dev]"])
def test_a_malformed_extra_is_refused(clone: Path, env: dict[str, str], arg: str) -> None:
    """An argument that is no extra name stops with exit 2 before pip sees it."""
    result = bootstrap(clone, env, "dev", arg)
    assert result.returncode == 2 and result.stdout == ""
    assert "not an option or an extra name" in result.stderr
    assert not (clone / ".venv").exists()


def test_rustyflow_python_skips_the_bootstrap(clone: Path, env: dict[str, str]) -> None:
    """RUSTYFLOW_PYTHON is used as it is: printed, and no .venv is made."""
    result = bootstrap(clone, {**env, "RUSTYFLOW_PYTHON": "/opt/py/bin/python"}, "--jit", "dev")
    assert result.returncode == 0 and result.stdout == "/opt/py/bin/python\n"
    assert not (clone / ".venv").exists()


def test_the_wrapper_works_in_a_fresh_shell(clone: Path, env: dict[str, str],
                                            tmp_path: Path) -> None:
    """`./rustyflow report`, as the README writes it, in a fresh clone and a fresh shell (no
    .venv, nothing activated): it makes .venv, then runs the package there, in the caller's
    folder with the arguments as given; later calls reuse .venv without pip."""
    here = tmp_path / "elsewhere"
    here.mkdir()
    for _ in range(2):
        result = subprocess.run([str(clone / "rustyflow"), "report", "--last", "1"], cwd=here,
                                env=env, capture_output=True, text=True, timeout=30,
                                check=False)
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"rustyflow report --last 1 (in {here})\n"
    assert [spec_extras(clone, s) for s in pip_specs(clone)] == [set()]
