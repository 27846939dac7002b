"""The MPI library, loaded only by a process that an MPI launcher started.

mpi4py is optional (the `mpi` extra): a single-process run never imports it, so the trainer
works where no MPI is installed. Whether a process was started by a launcher is read from the
variables the process managers set (MPICH's Hydra and Intel MPI: PMI_*, Open MPI: OMPI_*,
Slurm's srun: SLURM_* with PMI_* or PMIX_*); only then is MPI initialised.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import DistributedError, install_command

# made at import, when the command starts, in its working directory (errors.install_command)
EXTRA_HINT = (f"install an MPI: {install_command('mpi')} (mpi4py and MPICH), or load your "
              "cluster's MPI and install just mpi4py with the same pip")


def launched_size(env: Mapping[str, str] | None = None) -> int:
    """How many processes the launcher says this run has (1 when none started us)."""
    env = os.environ if env is None else env
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    steps = "SLURM_STEP_ID" in env or "SLURM_STEPID" in env
    value = env.get("SLURM_NTASKS", "").strip()
    if steps and value.isdigit() and ("PMIX_RANK" in env or "PMI_FD" in env
                                      or "PMI_RANK" in env):
        return int(value)
    return 1


def load_mpi() -> Any:
    """mpi4py's MPI module (initialising MPI on first use), or an error naming the extra."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise DistributedError(
            f"this process was started as one of several ranks, but MPI cannot be loaded "
            f"({exc}): {EXTRA_HINT}") from None
    except RuntimeError as exc:  # mpi4py found no MPI library to load
        raise DistributedError(f"mpi4py cannot load an MPI library ({exc}): {EXTRA_HINT}"
                               ) from None
    return MPI
