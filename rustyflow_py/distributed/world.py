"""Which process am I? Rank, size and local rank, from MPI.

Whatever started the run (`mpiexec`, `srun`, `rustyflow train --gpus N`), MPI knows each
process's rank and the run's size; the local rank (which GPU to take) is the rank within
MPI's shared-memory split of the world, i.e. among the processes on this node. So the rest
of the trainer sees one `World` and never asks which launcher it was.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import DistributedError
from .mpi import launched_size, load_mpi


@dataclass(frozen=True)
class World:
    """This process's place in the run; the default is a single process."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    launcher: str = "none"  # "mpiexec" | "srun" | "none"

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> World:
        """The world MPI set up, or World() when no launcher started this process."""
        env = os.environ if env is None else env
        expected = launched_size(env)
        if expected <= 1:
            return cls()
        mpi = load_mpi()
        world = mpi.COMM_WORLD
        if world.Get_size() != expected:
            raise DistributedError(
                f"the launcher started {expected} processes but MPI sees {world.Get_size()}: "
                "mpiexec and mpi4py use different MPI libraries; start the run with the "
                "mpiexec of the MPI that mpi4py loads (python -m mpi4py --mpi-library names it)")
        node = world.Split_type(mpi.COMM_TYPE_SHARED)
        try:
            local_rank, local_size = node.Get_rank(), node.Get_size()
        finally:
            node.Free()
        launcher = "srun" if "SLURM_STEP_ID" in env or "SLURM_STEPID" in env else "mpiexec"
        return cls(world.Get_rank(), world.Get_size(), local_rank, local_size, launcher)
