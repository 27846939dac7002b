"""The one exception root for every error a user can fix.

Anything raised as a `RustyFlowError` is expected: the command line prints its message as one
line (no traceback) and exits 1. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path


class RustyFlowError(Exception):
    """An expected error whose message names the problem and the fix."""


class ConfigError(RustyFlowError, ValueError):
    """A bad configuration value; the message names key, value, origin and what is expected."""


class DataError(RustyFlowError):
    """A dataset problem, with a message that says what to do about it."""


class CheckpointError(RustyFlowError):
    """A checkpoint is missing, corrupt, or does not fit the model it is loaded into."""


class DeviceError(RustyFlowError):
    """A device was asked for that cannot be used, or tensors of two devices were mixed."""


class TrainingError(RustyFlowError):
    """Training cannot go on (non-finite loss, an output path that cannot be written, ...)."""


class DistributedError(RustyFlowError):
    """A multi-process run cannot start or go on: no MPI, a launcher and an MPI that disagree,
    an mpiexec that cannot start (the message names the fix)."""


def command() -> str:
    """How to run `rustyflow` here, for the commands messages suggest: the wrapper the user
    ran (the repository's scripts set RUSTYFLOW_COMMAND to `./rustyflow`, or to its path when
    run from another folder), else `rustyflow` when it is on PATH (an activated .venv), else
    the `./rustyflow` wrapper when in its folder, else `python -m rustyflow_py`. A suggested
    command then works as written."""
    import os
    import shutil

    if os.environ.get("RUSTYFLOW_COMMAND"):
        return os.environ["RUSTYFLOW_COMMAND"]
    if shutil.which("rustyflow"):
        return "rustyflow"
    if os.access("rustyflow", os.X_OK) and os.path.isfile("rustyflow"):
        return "./rustyflow"
    return "python -m rustyflow_py"


def _shown(path: Path) -> str:
    """`path` as a command line writes it: relative to the working directory when inside it
    (`.venv/bin/pip`, `.`), else absolute."""
    here = Path.cwd()
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


def install_command(extra: str) -> str:
    """The command that installs optional extra `extra` into the Python running now, for the
    hints that name one. From a checkout (an editable install, the README's flow): its venv's
    pip on the checkout, `.venv/bin/pip install -e '.[plot]'` (plain `pip` when that venv is
    activated); an installed package: `pip install 'rustyflow-py[plot]'`. Never a bare `pip`
    that reaches another Python (the system's refuses: externally-managed-environment)."""
    import shlex
    import shutil
    import sys

    scripts = Path(sys.executable).parent  # not resolved: a venv's python is a symlink
    pip = next((p for p in (scripts / "pip", scripts / "pip3") if p.is_file()), None)
    on_path = shutil.which("pip")
    if pip is not None and on_path and Path(on_path).resolve() == pip.resolve():
        runner = "pip"  # the activated venv's own
    elif pip is not None:
        runner = shlex.quote(_shown(pip))
    else:
        runner = f"{shlex.quote(_shown(Path(sys.executable)))} -m pip"
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file() and (checkout / "rustyflow_py").is_dir():
        return f"{runner} install -e {shlex.quote(f'{_shown(checkout)}[{extra}]')}"
    return f"{runner} install {shlex.quote(f'rustyflow-py[{extra}]')}"


class InteropError(RustyFlowError):
    """A model in another format (a Hugging Face folder, a safetensors file) cannot be read or
    written: not GPT-2, a setting rustyflow cannot express, a damaged file, a missing extra."""
