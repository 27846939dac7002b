"""Which process am I? The rank, world size and rendezvous address, read from the launcher.

A data-parallel run is started by some launcher (RustyFlow's own, torchrun, mpirun, srun),
each of which tells a process its place through different environment variables. Reading
them in one place means the rest of the trainer sees one `World` and never asks which
launcher it was; checking them here turns a wrong variable into a one-line error that names
it, instead of a hang at the rendezvous.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from rustyflow_py.errors import ConfigError

DEFAULT_PORT = 29500

_SLURM_MASTER_HINT = (
    'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) '
    "in the batch script, before srun"
)
_MPI_MASTER_HINT = "pass -x MASTER_ADDR=<first host's name> to mpirun"
_SLURM_LOCAL_SIZE = "tasks on this node (SLURM_NTASKS_PER_NODE, SLURM_STEP_TASKS_PER_NODE)"


@dataclass(frozen=True)
class World:
    """This process's place in the run; the default is a single process."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    launcher: str = "none"  # "rustyflow" | "torchrun" | "slurm" | "openmpi" | "none"

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def describe(self) -> str:
        """One line for the banner, e.g. 'rank 1 of 4 (local 1 of 2, torchrun, ...)'."""
        if not self.distributed:
            return "single process"
        return (
            f"rank {self.rank} of {self.size} (local {self.local_rank} of {self.local_size}, "
            f"{self.launcher}, rendezvous {self.master_addr}:{self.master_port})"
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> World:
        """The world the launcher set up (default: `os.environ`); World() if none did."""
        env = os.environ if env is None else env
        if "RANK" in env and "WORLD_SIZE" in env:
            launcher = "rustyflow" if env.get("RUSTYFLOW_LAUNCHER") == "1" else "torchrun"
            rank_var, size_var = "RANK", "WORLD_SIZE"
            local_rank_var, local_size_var = "LOCAL_RANK", "LOCAL_WORLD_SIZE"
            rank, size = _int(env, rank_var), _int(env, size_var)
            local_rank = _int(env, local_rank_var, rank)
            local_size = _int(env, local_size_var, size)
            hint = "set it to rank 0's host name or address"
        elif "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
            launcher = "openmpi"
            rank_var, size_var = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
            local_rank_var, local_size_var = (
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            )
            rank, size = _int(env, rank_var), _int(env, size_var)
            local_rank, local_size = _int(env, local_rank_var), _int(env, local_size_var)
            hint = _MPI_MASTER_HINT
        elif _under_srun(env):
            launcher = "slurm"
            rank_var, size_var = "SLURM_PROCID", "SLURM_NTASKS"
            local_rank_var, local_size_var = "SLURM_LOCALID", _SLURM_LOCAL_SIZE
            rank, size = _int(env, rank_var), _int(env, size_var)
            local_rank, local_size = _int(env, local_rank_var), _slurm_local_size(env)
            hint = _SLURM_MASTER_HINT
        else:
            return cls()
        _check_range(rank_var, rank, size_var, size)
        _check_range(local_rank_var, local_rank, local_size_var, local_size)
        addr = env.get("MASTER_ADDR")
        if size > 1 and not (addr and addr.strip()):
            shown = "not set" if addr is None else f"set to {addr!r}"
            raise ConfigError(
                f"MASTER_ADDR is {shown}, but {launcher} started {size} processes and they "
                f"need rank 0's address to meet: {hint}"
            )
        port = _int(env, "MASTER_PORT", DEFAULT_PORT)
        if not 1 <= port <= 65535:
            raise ConfigError(f"MASTER_PORT={port} is not a TCP port: expected 1 to 65535")
        return cls(
            rank=rank,
            size=size,
            local_rank=local_rank,
            local_size=local_size,
            master_addr=addr.strip() if addr else cls.master_addr,
            master_port=port,
            launcher=launcher,
        )


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    """An integer environment variable; `default` when unset, else it is required."""
    value = env.get(name)
    if value is None:
        if default is None:
            raise ConfigError(f"{name} is not set: the launcher should set it to an integer")
        return default
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer") from None


def _check_range(name: str, value: int, size_name: str, size: int) -> None:
    if size < 1:
        raise ConfigError(f"{size_name}={size}: expected at least 1 process")
    if not 0 <= value < size:
        raise ConfigError(f"{name}={value} is outside 0..{size - 1} ({size_name}={size})")


def _under_srun(env: Mapping[str, str]) -> bool:
    """Inside an `srun` step of several tasks (not the batch script, which has no step id)."""
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return False
    if "SLURM_STEP_ID" not in env and "SLURM_STEPID" not in env:
        return False
    return _int(env, "SLURM_NTASKS") > 1


def _slurm_local_size(env: Mapping[str, str]) -> int:
    """Tasks on this node: SLURM_NTASKS_PER_NODE if a plain integer, else this node's (or the
    first) entry of SLURM_STEP_TASKS_PER_NODE (e.g. '2(x3),1'), else 1."""
    per_node = env.get("SLURM_NTASKS_PER_NODE", "").strip()
    if per_node.isdigit():
        return int(per_node)
    counts: list[int] = []
    for entry in env.get("SLURM_STEP_TASKS_PER_NODE", "").split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", entry)
        if match is None:
            break
        counts += [int(match[1])] * int(match[2] or 1)
    if not counts:
        return 1
    node = env.get("SLURM_NODEID", "")
    return counts[int(node)] if node.isdigit() and int(node) < len(counts) else counts[0]
