"""The one exception root for every error a user can fix.

Anything raised as a `RustyFlowError` is expected: the command line prints its message as one
line (no traceback) and exits 1. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


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
    """How to run `rustyflow` here, for the commands messages suggest: `rustyflow` when it is
    on PATH (an activated .venv), else the repository's `./rustyflow` wrapper when in its
    folder, else `python -m rustyflow_py`. A suggested command then works as written."""
    import os
    import shutil

    if shutil.which("rustyflow"):
        return "rustyflow"
    if os.access("rustyflow", os.X_OK) and os.path.isfile("rustyflow"):
        return "./rustyflow"
    return "python -m rustyflow_py"


class InteropError(RustyFlowError):
    """A model in another format (a Hugging Face folder, a safetensors file) cannot be read or
    written: not GPT-2, a setting rustyflow cannot express, a damaged file, a missing extra."""
