"""World.from_env: each launcher's variables, the fallback to one process, and the errors."""

from __future__ import annotations

import pytest

from rustyflow_py.engine.world import World
from rustyflow_py.errors import ConfigError

TORCHRUN = {
    "RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "MASTER_ADDR": "node01",
}
SRUN = {
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "MASTER_ADDR": "gpu-node-7",
    "MASTER_PORT": "31000",
}


def test_nothing_set_is_one_process() -> None:
    world = World.from_env({"PATH": "/usr/bin"})
    assert world == World()
    assert not world.distributed and world.main and world.launcher == "none"
    assert world.describe() == "single process"


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in TORCHRUN.items():
        monkeypatch.setenv(key, value)
    assert World.from_env().rank == 1


def test_torchrun() -> None:
    world = World.from_env(TORCHRUN)
    assert world == World(1, 4, 1, 2, "10.0.0.1", 29500, "torchrun")
    assert world.distributed and not world.main
    assert world.describe() == "rank 1 of 4 (local 1 of 2, torchrun, rendezvous 10.0.0.1:29500)"


def test_rustyflow_launcher_and_defaults() -> None:
    env = {"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "RUSTYFLOW_LAUNCHER": "1"}
    world = World.from_env(env)
    # LOCAL_RANK defaults to the rank, LOCAL_WORLD_SIZE to the size, MASTER_PORT to 29500
    assert world == World(2, 3, 2, 3, "127.0.0.1", 29500, "rustyflow")


def test_torchrun_of_one_needs_no_master_addr() -> None:
    world = World.from_env({"RANK": "0", "WORLD_SIZE": "1"})
    assert world == World(launcher="torchrun") and not world.distributed


def test_openmpi() -> None:
    assert World.from_env(OPENMPI) == World(5, 8, 1, 4, "node01", 29500, "openmpi")


def test_torchrun_variables_win_over_openmpi() -> None:
    assert World.from_env({**OPENMPI, **TORCHRUN}).launcher == "torchrun"


def test_slurm_under_srun() -> None:
    assert World.from_env(SRUN) == World(3, 4, 1, 2, "gpu-node-7", 31000, "slurm")
    old_name = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"} | {"SLURM_STEPID": "0"}
    assert World.from_env(old_name).launcher == "slurm"


@pytest.mark.parametrize(
    ("extra", "local_size"),
    [
        ({"SLURM_NTASKS_PER_NODE": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}, 4),
        ({"SLURM_NTASKS_PER_NODE": "2(x2)", "SLURM_STEP_TASKS_PER_NODE": "3,1"}, 3),
        ({"SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "1", "SLURM_LOCALID": "0"}, 1),
        ({"SLURM_STEP_TASKS_PER_NODE": "3(x2),2", "SLURM_NODEID": "2"}, 2),
        ({"SLURM_STEP_TASKS_PER_NODE": ""}, 1),
    ],
)
def test_slurm_local_size(extra: dict[str, str], local_size: int) -> None:
    env = {**SRUN, "SLURM_LOCALID": "0", **extra}
    assert World.from_env(env).local_size == local_size


def test_slurm_batch_script_is_one_process() -> None:
    """The sbatch script itself has SLURM_PROCID and SLURM_NTASKS but no step id."""
    batch = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"} | {"SLURM_PROCID": "0"}
    assert World.from_env(batch) == World()


def test_srun_of_one_task_is_one_process() -> None:
    assert World.from_env({**SRUN, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == World()


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({**TORCHRUN, "RANK": "one"}, ["RANK='one'", "not an integer"]),
        ({**TORCHRUN, "WORLD_SIZE": "0"}, ["WORLD_SIZE=0", "at least 1"]),
        ({**TORCHRUN, "RANK": "4"}, ["RANK=4", "0..3", "WORLD_SIZE=4"]),
        ({**TORCHRUN, "RANK": "-1"}, ["RANK=-1", "0..3"]),
        ({**TORCHRUN, "LOCAL_RANK": "2"}, ["LOCAL_RANK=2", "0..1", "LOCAL_WORLD_SIZE=2"]),
        ({**TORCHRUN, "LOCAL_WORLD_SIZE": "x"}, ["LOCAL_WORLD_SIZE='x'", "not an integer"]),
        ({**TORCHRUN, "MASTER_PORT": "70000"}, ["MASTER_PORT=70000", "1 to 65535"]),
        ({**TORCHRUN, "MASTER_PORT": "0"}, ["MASTER_PORT=0", "1 to 65535"]),
        ({**TORCHRUN, "MASTER_PORT": "http"}, ["MASTER_PORT='http'", "not an integer"]),
        ({**TORCHRUN, "MASTER_ADDR": " "}, ["MASTER_ADDR", "set to ' '", "4 processes"]),
        (
            {k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"},
            ["MASTER_ADDR is not set", "torchrun started 4"],
        ),
        (
            {**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "4"},
            ["OMPI_COMM_WORLD_LOCAL_RANK=4", "OMPI_COMM_WORLD_LOCAL_SIZE=4"],
        ),
        (
            {k: v for k, v in OPENMPI.items() if k != "OMPI_COMM_WORLD_LOCAL_SIZE"},
            ["OMPI_COMM_WORLD_LOCAL_SIZE is not set"],
        ),
        (
            {k: v for k, v in OPENMPI.items() if k != "MASTER_ADDR"},
            ["MASTER_ADDR is not set", "mpirun"],
        ),
        ({**SRUN, "SLURM_NTASKS": "four"}, ["SLURM_NTASKS='four'", "not an integer"]),
        ({**SRUN, "SLURM_PROCID": "4"}, ["SLURM_PROCID=4", "SLURM_NTASKS=4"]),
        ({**SRUN, "SLURM_LOCALID": "2"}, ["SLURM_LOCALID=2", "tasks on this node"]),
        (
            {k: v for k, v in SRUN.items() if k != "MASTER_ADDR"},
            ["MASTER_ADDR is not set", 'scontrol show hostnames "$SLURM_JOB_NODELIST"'],
        ),
    ],
)
def test_errors_name_the_variable_and_value(env: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        World.from_env(env)
    for word in words:
        assert word in str(err.value)
