"""Data parallelism launched by Slurm's `srun`, as on a cluster: the ranks' world from Slurm's
PMI (pmi2, which the `mpi` extra's MPICH speaks), training equal to one process with the
whole batch, and a dead or stopped rank ending the job with a line naming it.

They need a Slurm cluster of this machine's own: `scripts/slurm/local-cluster.sh start DIR`,
then the `export SLURM_CONF=...` it prints (CI does both). A SLURM_CONF of any other cluster
is left alone: these tests never submit work to a real one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from test_data_parallel import (
    HAVE_MPI,
    STEPS,
    Runs,
    assert_same_losses,
    assert_same_weights,
    child_env,
    kill_marked,
    losses,
    marked_pids,
    no_config_in_environment,  # noqa: F401  (autouse: no config keys from our environment)
    signal_rank_1,
    train_command,
    wait_until,
)

from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.training.outputs.checkpoint import Checkpoint

LOCAL_CLUSTER = "ClusterName=rustyflow-local"  # what local-cluster.sh writes


def local_slurm_conf() -> str | None:
    """SLURM_CONF when it is local-cluster.sh's and srun exists, else None."""
    conf = os.environ.get("SLURM_CONF", "")
    try:
        ours = LOCAL_CLUSTER in Path(conf).read_text().splitlines()
    except OSError:
        ours = False
    return conf if ours and shutil.which("srun") and HAVE_MPI else None


CONF = local_slurm_conf()
SETUP = ("scripts/slurm/local-cluster.sh start DIR, then export the SLURM_CONF it prints (and "
         "pip install -e '.[mpi]')")
needs_slurm = pytest.mark.skipif(CONF is None, reason=f"needs srun and a local Slurm: {SETUP}")


def test_the_local_slurm_is_there_where_it_is_required() -> None:
    """CI sets RUSTYFLOW_WITH_SLURM=1 after starting the cluster: there the srun tests must
    run, not skip."""
    if os.environ.get("RUSTYFLOW_WITH_SLURM") != "1":
        pytest.skip("RUSTYFLOW_WITH_SLURM is not 1: the srun tests may skip")
    assert CONF is not None, f"RUSTYFLOW_WITH_SLURM=1 but no local Slurm: {SETUP}"


def srun(command: list[str], tasks: int, mark: str, out: Path) -> subprocess.Popen[bytes]:
    """`srun -n tasks --kill-on-bad-exit=1 command` (PMI2 is the local cluster's default), its
    output to `out`."""
    assert CONF is not None
    with open(out, "w") as stream:  # the child keeps its own copy
        return subprocess.Popen(["srun", "-n", str(tasks), "--kill-on-bad-exit=1", *command],
                                stdin=subprocess.DEVNULL, stdout=stream,
                                stderr=subprocess.STDOUT, env=child_env(mark, SLURM_CONF=CONF))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("slurm"))


def srun_train(runs: Runs, name: str, tasks: int, **keys: object) -> Path:
    """Train `name` under srun to its end; its checkpoint's path."""
    mark, out = uuid.uuid4().hex, runs.folder / f"{name}.out"
    proc = srun(train_command(runs.config(name, **keys)), tasks, mark, out)
    try:
        status = proc.wait(timeout=120)
    finally:
        proc.kill()
        kill_marked(mark)
    assert status == 0, out.read_text()
    return runs.checkpoint_path(name)


@needs_slurm
@pytest.mark.parametrize(("name", "keys"), [
    ("srun2", {"BATCH_SIZE": 4}),
    ("srun2_zero_accum", {"BATCH_SIZE": 2, "GRAD_ACCUM_STEPS": 2, "SHARD_OPTIMIZER": True}),
])
def test_two_srun_tasks_equal_one_process_of_the_whole_batch(runs: Runs, name: str,
                                                             keys: dict[str, object]) -> None:
    got, single8 = Checkpoint(srun_train(runs, name, 2, **keys)), runs["single8"]
    assert len(losses(got)) == STEPS and losses(got)[0] != losses(got)[-1]
    assert_same_losses(got, single8)
    assert_same_weights(got, single8)
    [record] = read_log(runs.log_path(name))  # only rank 0 writes
    assert record["status"] == "completed"
    assert record["parallel"]["launcher"] == "srun"
    assert record["parallel"]["world_size"] == 2


@needs_slurm
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_a_dead_or_stopped_srun_task_ends_the_job_naming_it(runs: Runs, signum: int) -> None:
    """Task 1 SIGKILLed (srun names it) or SIGSTOPped (rank 0's heartbeat names it and aborts
    the job through Slurm's PMI): a non-zero exit within COMM_TIMEOUT and a little, and no
    process left."""
    mark, out = uuid.uuid4().hex, runs.folder / f"sig{signum}.out"
    config = runs.config(f"sig{signum}", BATCH_SIZE=4, MAX_STEPS=0, NUM_EPOCHS=1000,
                         COMM_TIMEOUT=5)
    proc = srun(train_command(config), 2, mark, out)
    try:
        wait_until(lambda: "  step 2 (" in out.read_text() or proc.poll() is not None,
                   "step 2", 60)
        status, output, seconds = signal_rank_1(proc, mark, signum, out, 40)
        assert status != 0, output
        want = ("task 1: Killed" if signum == signal.SIGKILL  # srun's line (the heartbeat's
                else "Error: rank 1 has been silent for")  # may come first, or not at all)
        assert want in output, output
        assert seconds < 5 + 15, output  # COMM_TIMEOUT, then the abort
        wait_until(lambda: not marked_pids(mark), "every task to be gone", 15)
    finally:
        proc.kill()
        proc.wait()
        kill_marked(mark)
