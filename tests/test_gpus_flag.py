"""`train --gpus N` means GPUs: without N usable ones nothing is started, and the error says
how many are usable, why, and what to pass (`--processes N --device cpu` is the CPU's data
parallelism). A job that fails under rustyflow's launcher shows its error once, with none of
MPI's own account of the abort (MPICH's `Abort(1) on node ...`, Hydra's `[mpiexec@host]`
exit codes and BAD TERMINATION banner, Open MPI's framed notes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY, env_file, invoke, make_cfg, subprocess_env

from rustyflow_py.distributed import launcher
from rustyflow_py.distributed.launcher import ranks_to_start, usable_gpus
from rustyflow_py.distributed.mpi_report import Quiet
from rustyflow_py.distributed.world import World
from rustyflow_py.errors import DistributedError

pytestmark = pytest.mark.usefixtures("tiny_dir")
try:
    import mpi4py  # noqa: F401

    HAVE_MPI = True
except ImportError:
    HAVE_MPI = False
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="needs MPI: pip install -e '.[mpi]'")

NO_GPU = ("Error: --gpus 2 starts one process per GPU, and no GPU is usable here "
          "(RUSTYFLOW_DISABLE_GPU is set): pass --gpus 1 to train in one process, or "
          "--processes 2 --device cpu for 2 data-parallel processes on the CPU\n")


def train(*flags: str) -> subprocess.CompletedProcess[str]:
    """`python -m rustyflow_py train --config tiny.env FLAGS` as a user runs it, no GPU."""
    return subprocess.run([sys.executable, "-m", "rustyflow_py", "train", "--config",
                           "tiny.env", *flags], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=120, env=subprocess_env(RUSTYFLOW_DISABLE_GPU="1"))


def test_gpus_without_a_gpu_stops_before_starting_anything(tiny_dir: Path) -> None:
    result = train("--gpus", "2", "--device", "auto")
    assert result.returncode == 1, result.stderr
    assert result.stderr == NO_GPU and result.stdout == ""  # no `starting 2 processes`
    assert not (tiny_dir / "models").exists() and not (tiny_dir / "log.txt").exists()


def test_gpus_from_the_config_file_is_named_as_such(tiny_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUSTYFLOW_DISABLE_GPU", "1")
    (tiny_dir / "tiny.env").write_text(env_file({**TINY, "DEVICE": "gpu", "NUM_GPUS": 2}))
    result = invoke("train", "--config", "tiny.env")
    assert result.exit_code == 1
    assert result.output == NO_GPU.replace("--gpus 2 starts", "NUM_GPUS=2 (tiny.env) starts")


def test_gpus_beyond_the_usable_ones_names_how_many_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with one GPU (its probe's answer) asked for two."""
    monkeypatch.setattr(launcher, "usable_gpus",
                        lambda wanted: (1, "no CUDA device 1 (this machine has 1)"))
    result = invoke("train", "--config", "tiny.env", "--gpus", "2", "--device", "gpu")
    assert result.exit_code == 1
    assert result.output == ("Error: --gpus 2 starts one process per GPU, and only 1 GPU is "
                             "usable here (GPU 1: no CUDA device 1 (this machine has 1)): pass "
                             "--gpus 1\n")


def test_the_gpu_probe_runs_in_a_child_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUSTYFLOW_DISABLE_GPU", "1")
    assert usable_gpus(2) == (0, "RUSTYFLOW_DISABLE_GPU is set")


@pytest.mark.parametrize(("flags", "message"), [
    (("--processes", "2", "--device", "auto"),
     "Error: --processes 2 starts processes on the CPU, but DEVICE=auto: add --device cpu, or "
     "pass --gpus 2 for one process per GPU\n"),
    (("--processes", "2", "--gpus", "2", "--device", "gpu"),
     "Error: --gpus 2 asks for one process per GPU and --processes 2 for processes on the CPU: "
     "pass one of them\n"),
], ids=["processes-on-a-gpu-device", "processes-and-gpus"])
def test_processes_take_the_cpu_and_exclude_gpus(flags: tuple[str, ...], message: str) -> None:
    result = invoke("train", "--config", "tiny.env", *flags)
    assert result.exit_code == 1
    assert result.output == message


def test_under_a_launcher_processes_must_agree_with_it() -> None:
    """`mpiexec -n 3 rustyflow train --processes 2`: each rank trains (no launch of its own),
    and a count that disagrees with the launcher's is refused."""
    cfg = make_cfg()
    assert ranks_to_start(cfg, 3, World(rank=1, size=3, launcher="mpiexec")) == 0
    with pytest.raises(DistributedError) as info:
        ranks_to_start(cfg, 2, World(rank=1, size=3, launcher="mpiexec"))
    assert str(info.value) == ("--processes 2 but the launcher (mpiexec) started 3 processes: "
                               "drop --processes (the launcher's count decides) or make them "
                               "agree")


@needs_mpi
def test_a_failing_job_says_its_error_once_without_mpi_s_abort_noise(tiny_dir: Path) -> None:
    """Both ranks find the text too short for 2 x BATCH_SIZE streams and abort the job: one
    `Error:` line (the launcher's, from the rank that ended it), none of MPI's lines."""
    (tiny_dir / "short.txt").write_text("a b c\n" * 20)
    (tiny_dir / "tiny.env").write_text(env_file({**TINY, "DATASET": "short.txt"}))
    result = train("--processes", "2")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = (result.stdout + result.stderr).splitlines()
    assert lines[0].startswith("starting 2 processes: ") and " -n 2 " in lines[0]
    [error] = [line for line in lines if "Error" in line]
    assert error.startswith(("Error: rank 0 failed: short: ", "Error: rank 1 failed: short: "))
    assert "too few for BATCH_SIZE=4 x 2 processes = 8 streams" in error, error
    assert lines == [lines[0], error], lines  # nothing else: no Abort(, no [mpiexec@


HYDRA_KILL = """
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 17785 RUNNING AT vm
=   EXIT CODE: 9
=   CLEANING UP REMAINING PROCESSES
=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES
===================================================================================
[mpiexec@vm] Exit codes: [vm] 0,9
YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)
This typically refers to a problem with your application.
Please see the FAQ page for debugging suggestions
"""
MPICH_ABORT = ("Abort(1) on node 1 (rank 1 in comm 496): application called "
               "MPI_Abort(comm=0x84000001, 1) - process 1\n")
DASHES = "-" * 74 + "\n"
OPEN_MPI_ABORT = (f"{DASHES}MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n"
                  "with errorcode 1.\n\nNOTE: invoking MPI_ABORT causes Open MPI to kill all "
                  f"MPI processes.\n{DASHES}{DASHES}Primary job  terminated normally, but 1 "
                  "process returned\na non-zero exit code. Per user-direction, the job has "
                  f"been aborted.\n{DASHES}")


def quieted(text: str) -> str:
    quiet = Quiet()
    kept = [line for raw in text.splitlines(keepends=True) for line in quiet(raw)]
    return "".join(kept + quiet.rest())


def test_mpi_s_account_of_an_abort_is_dropped_and_the_ranks_output_kept() -> None:
    ours = "  step 3 (epoch 1, batch 3): loss 2.0542\n=== end of run ===\n"
    assert quieted(ours + MPICH_ABORT + HYDRA_KILL) == ours + "\n"  # Hydra's leading blank
    assert quieted(ours + OPEN_MPI_ABORT + ours) == ours + ours


def test_a_frame_of_dashes_that_tells_of_no_abort_is_passed_on_whole() -> None:
    other = f"{DASHES}WARNING: There was an error initializing an OpenFabrics device.\n{DASHES}"
    assert quieted(other) == other
    assert quieted(DASHES + "never closed\n") == DASHES + "never closed\n"
