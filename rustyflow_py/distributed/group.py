"""Joining a data-parallel run, and failing it loudly: one line naming the rank, never a hang.

A rank that raises aborts the whole job (MPI_Abort: the launcher then kills every process,
the stopped ones included), after saying which rank failed and why; a rank that falls silent
is named by the others' heartbeat, which aborts the job the same way. A stop signal is no
failure: every rank stops at the same step and leaves in order.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, NoReturn

from ..engine.backend import device_name
from ..engine.devices import gpu_unavailable_reason
from ..errors import ConfigError, RustyFlowError
from .heartbeat import Heartbeat
from .launcher import leave_error, leave_pid
from .mpi import launched_size, load_mpi
from .world import World

ABORT_GRACE_S = 1.0  # between a failing rank's last line and MPI_Abort
ABORT_EXIT_S = 5.0  # how long MPI_Abort may take before this process ends itself


def abort(comm: Any, rank: int, message: str) -> NoReturn:
    """Say why, then end the whole job. Under `--gpus` the line goes to its error file only:
    `--gpus` prints the one line of the rank that ended the job, once (every rank that fails
    alike would otherwise print it too). Else it goes to stderr, where the kill that MPI_Abort
    brings can overtake mpiexec's relay of it, so the line gets a moment's start (a failing
    job can spare it). MPI_Abort may return before the kill arrives:
    this process then exits at once, so that nothing more (a second report, a traceback)
    comes from it.

    MPI_Abort may also never return: MPICH tells the launcher, then calls exit(), whose
    handlers tear the CUDA context down, and with an NCCL kernel still waiting on the GPU for
    a stopped peer that teardown waits for ever (seen on H100s: Hydra then waits for this
    process for ever too). So a watchdog that needs no GIL (faulthandler's, in C) ends the
    process with _exit(1) if it is still here ABORT_EXIT_S later; the launcher then ends the
    other ranks as for any rank that died, and names this one's message."""
    if not leave_error(rank, message):
        print(f"Error: {message}", file=sys.stderr, flush=True)
        time.sleep(ABORT_GRACE_S)
    # faulthandler keeps its own reference to the file until the watchdog fires
    faulthandler.dump_traceback_later(ABORT_EXIT_S, exit=True,
                                      file=open(os.devnull, "w"))
    comm.Abort(1)
    os._exit(1)


def end_job_if_rank(message: str) -> None:
    """In a process an MPI launcher started, failing outside `process_group` (a bad flag, a
    config error): end the job, or the other ranks would wait for this one in MPI for ever;
    nothing in a single process."""
    if launched_size() > 1:
        world = load_mpi().COMM_WORLD
        abort(world, world.Get_rank(), f"rank {world.Get_rank()} failed: {message}")


@contextlib.contextmanager
def process_group(world: World, timeout: float) -> Iterator[Any]:
    """The run's MPI communicator (None when alone), with the heartbeat running inside."""
    if not world.distributed:
        yield None
        return
    mpi = load_mpi()
    comm = mpi.COMM_WORLD.Dup()

    def silent(peer: int, seconds: float) -> None:
        abort(comm, world.rank, f"rank {peer} has been silent for {seconds:.1f} s "
              f"(COMM_TIMEOUT={timeout:g}): it is stopped, hung or gone; rank {world.rank} "
              "ends the job (the last checkpoint is intact: resume with --resume)")

    leave_pid(world.rank)
    heartbeat = Heartbeat(mpi.COMM_WORLD.Dup(), timeout, silent)
    heartbeat.start()
    try:
        yield comm
    except KeyboardInterrupt:  # a stop signal: every rank stops at the same step
        raise
    except BaseException as exc:
        text = str(exc) if isinstance(exc, RustyFlowError) else f"{type(exc).__name__}: {exc}"
        abort(comm, world.rank, f"rank {world.rank} failed: {text}")
    finally:
        heartbeat.stop()


# Settings that may differ between processes: where this machine keeps the data, and the
# outputs only rank 0 writes.
PER_PROCESS_KEYS = ("DATA_DIR", "LOG_FILE", "MODEL_PATH", "THREADS")


def check_same_config(comm: Any, world: World, config: dict[str, Any]) -> None:
    """Every process must train the same run: compare each one's settings with the others'."""
    config = {k: v for k, v in config.items() if k not in PER_PROCESS_KEYS}
    mine = json.dumps(config, sort_keys=True, default=str)
    for rank, theirs in enumerate(comm.allgather(mine)):
        if theirs != mine:
            other = json.loads(theirs)
            diff = [f"{k}={config.get(k)} here vs {other.get(k)}" for k in sorted(config)
                    if config.get(k) != other.get(k)]
            raise ConfigError(f"rank {world.rank} and rank {rank} are configured differently "
                              f"({', '.join(diff[:5])}): start every process with the same "
                              "config file, flags and environment")


def rank_device(requested: str, world: World) -> str:
    """The device this process trains on: in a data-parallel run, GPU <local rank> (DEVICE=gpu
    or auto with a usable GPU; every process must resolve alike) or the CPU."""
    if not world.distributed or requested == "cpu":
        return requested
    if requested == "auto" and gpu_unavailable_reason(world.local_rank) is not None:
        return "cpu"
    if ":" in requested and world.local_size > 1:
        raise ConfigError(f"DEVICE={requested} pins every process to one GPU, but "
                          f"{world.local_size} processes share this machine: set DEVICE=gpu "
                          "(each process takes the GPU of its local rank)")
    return requested if ":" in requested else device_name("gpu", world.local_rank)
