"""The distributed layer's parts: which launcher started a process, the World MPI reports, and
the CPU communicator's collectives on real MPI ranks (`mpiexec -n 3`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rustyflow_py.distributed.mpi import launched_size
from rustyflow_py.distributed.world import World

REPO = Path(__file__).resolve().parents[1]
try:
    import mpi4py  # noqa: F401

    from rustyflow_py.distributed.launcher import find_mpiexec

    MPIEXEC: str | None = find_mpiexec()
except Exception:  # no mpi extra: the MPI tests skip
    MPIEXEC = None
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="needs MPI: pip install -e '.[mpi]'")


@pytest.mark.parametrize(("env", "size"), [
    ({"PATH": "/usr/bin"}, 1),
    ({"PMI_RANK": "1", "PMI_SIZE": "4"}, 4),  # MPICH's Hydra, Intel MPI
    ({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "5"}, 8),  # Open MPI
    ({"PMIX_RANK": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "16"}, 16),  # srun --mpi=pmix
    ({"SLURM_NTASKS": "16", "SLURM_PROCID": "0"}, 1),  # the batch script itself: no step
    ({"SLURM_NTASKS": "16", "SLURM_STEP_ID": "0"}, 1),  # srun without an MPI plugin
])
def test_launched_size_reads_each_process_manager(env: dict[str, str], size: int) -> None:
    assert launched_size(env) == size


def test_no_launcher_is_one_process_without_loading_mpi() -> None:
    world = World.from_env({"PATH": "/usr/bin"})
    assert world == World() and not world.distributed and world.main


RANK_SCRIPT = """
import numpy as np
from mpi4py import MPI
from rustyflow_py.distributed.comm import communicator
from rustyflow_py.distributed.world import World
from rustyflow_py.engine.library import get_backend

world = World.from_env()
assert (world.size, world.local_size, world.launcher) == (3, 3, "mpiexec")
assert world.rank == MPI.COMM_WORLD.Get_rank() == world.local_rank
comm = communicator(get_backend("cpu"), MPI.COMM_WORLD.Dup())
r = world.rank
flag = np.asarray(float(r), dtype=np.float32)  # 0-d, as the stop agreement sends it
comm.all_reduce(flag)
assert float(flag) == 3.0
x = np.arange(12, dtype=np.float64) * (r + 1)  # 4 elements a shard
comm.all_reduce(x)
np.testing.assert_array_equal(x, np.arange(12) * 6)
y = np.arange(12, dtype=np.float32) * (r + 1)
comm.reduce_scatter(y)
mine = comm.shard(y)
np.testing.assert_array_equal(y[mine], np.arange(12, dtype=np.float32)[mine] * 6)
z = np.full(12, -1.0, np.float32)
z[comm.shard(z)] = r
comm.all_gather(z)
np.testing.assert_array_equal(z, np.repeat([0.0, 1.0, 2.0], 4))
comm.close(clean=True)
print(f"rank {r} ok", flush=True)
"""


@needs_mpi
def test_mpi_world_and_cpu_collectives_on_three_ranks() -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_", "HYDRA_"))}
    env["PYTHONPATH"] = str(REPO)
    env["RUSTYFLOW_DISABLE_GPU"] = "1"
    result = subprocess.run([MPIEXEC, "-n", "3", sys.executable, "-c", RANK_SCRIPT], env=env,
                            capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    # (mpiexec relays each rank's lines as they come: they may interleave)
    assert sorted(re.findall(r"rank \d ok", result.stdout)) == ["rank 0 ok", "rank 1 ok",
                                                                 "rank 2 ok"]


HUNG_ABORT = """
import threading, time
from rustyflow_py.distributed import group

class HungComm:  # MPI_Abort stuck in exit()'s CUDA teardown, as seen on H100s
    def Abort(self, code):
        threading.Event().wait()  # for ever

group.abort(HungComm(), 0, "rank 1 has been silent for 9.0 s")
"""


def test_an_abort_whose_mpi_abort_never_returns_still_ends_the_process(tmp_path: Path) -> None:
    """The watchdog in C ends the process with status 1 a few seconds after MPI_Abort was
    called, having said why in the launcher's error file (which the launcher prints, once:
    nothing on stderr)."""
    from rustyflow_py.distributed.group import ABORT_EXIT_S, ABORT_GRACE_S

    env = {**os.environ, "PYTHONPATH": str(REPO), "RUSTYFLOW_ERROR_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", HUNG_ABORT], env=env, capture_output=True,
                            text=True, timeout=ABORT_GRACE_S + ABORT_EXIT_S + 60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 1, result.stderr
    assert result.stderr == ""  # no traceback, and the line only once: the launcher's
    assert (tmp_path / "rank-0.txt").read_text().strip() == "rank 1 has been silent for 9.0 s"
