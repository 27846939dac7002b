"""Data-parallel training on the CPU: real MPI ranks (`mpiexec -n N python -m rustyflow_py
train`, MPI's collectives on the CPU), the way a cluster starts them. The model (1 layer, 32
wide) and the corpus (a few thousand tokens of random words, written to a temp folder) are
tiny, so a run takes a few seconds and the tests can afford to compare exactly what data
parallelism promises:

- N ranks x BATCH_SIZE B == 1 process x N*B == 1 process x B x GRAD_ACCUM_STEPS N, step by
  step (fp32, to 1e-4), with and without ZeRO-1 (SHARD_OPTIMIZER), whose checkpoint holds the
  full optimizer state;
- a resume may change the number of processes when the global batch stays, and is refused
  with the numbers when it does not;
- a rank that fails, is SIGKILLed or is SIGSTOPped ends the job non-zero, promptly (within
  COMM_TIMEOUT for the silent one), naming the rank, leaving no process behind; a SIGTERM to
  mpiexec leaves one interrupted log block and a resumable checkpoint;
- the data sharding and the bucketed all-reduce, as units.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from rustyflow_py.cli import main
from rustyflow_py.distributed.data_parallel import BucketedAllReduce
from rustyflow_py.distributed.launcher import find_mpiexec
from rustyflow_py.distributed.mpi import EXTRA_HINT
from rustyflow_py.distributed.world import World
from rustyflow_py.engine.autograd import Function, Tensor
from rustyflow_py.engine.library import get_backend
from rustyflow_py.errors import ConfigError
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.reporting.record_schema import BLOCK_START
from rustyflow_py.training.config.config import KEYS, load_config
from rustyflow_py.training.outputs.checkpoint import Checkpoint
from rustyflow_py.training.run.loop import Trainer, check_world

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT = 120  # seconds for one launched run; a hang fails the test instead of blocking
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "SLURM_", "HYDRA_", "RUSTYFLOW_ERROR")
try:
    import mpi4py  # noqa: F401

    HAVE_MPI = True
except ImportError:
    HAVE_MPI = False
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="needs MPI: pip install -e '.[mpi]'")
MARK = "RUSTYFLOW_DP_TEST"  # in every process a test starts, so cleanup finds its own only

# What every run shares. THREADS=1: up to four workers share two cores. BUCKET_MB is small
# enough that the gradient of the ~15k-parameter model travels in several buckets.
BASE = {
    "SEQ_LEN": 16,
    "EMBED_DIM": 32,
    "NUM_HEADS": 2,
    "NUM_LAYERS": 1,
    "LEARNING_RATE": 0.01,
    "WARMUP_STEPS": 0,
    "LOG_INTERVAL": 1,
    "PROFILE": False,
    "DEVICE": "cpu",
    "SEED": 1337,
    "THREADS": 1,
    "MAX_STEPS": 6,
    "BUCKET_MB": 0.01,
    "GRAD_CLIP": 0.5,  # below every step's gradient norm: a wrong (per-shard) norm would show
}
STEPS = 6



def corpus_text() -> str:
    """~3.4k tokens of random words from a 41-word vocabulary (42 with <eos>, so the model's
    parameter count is not a multiple of 3 and a 3-way ZeRO shard needs padding)."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(41)]
    return "".join(" ".join(rng.choice(words, int(rng.integers(4, 9)))) + "\n"
                   for _ in range(450))


# ------------------------------------------------------------------------------ processes


def child_env(mark: str, **extra: str) -> dict[str, str]:
    """This checkout's package, no config keys or launcher variables from our environment,
    no GPU (every rank trains on the CPU), and the mark that cleanup looks for."""
    env = {k: v for k, v in os.environ.items()
           if k not in KEYS and not k.startswith(LAUNCHER_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {**env, "RUSTYFLOW_DISABLE_GPU": "1", MARK: mark, **extra}


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours
        return []


def marked_pids(mark: str, rank: int | None = None) -> list[int]:
    """The live processes started with `mark` (and MPI rank `rank`, when given: MPICH's
    PMI_RANK or Open MPI's OMPI_COMM_WORLD_RANK, the device machines' system MPI)."""
    mine = f"{MARK}={mark}".encode()
    ranks = ({f"{name}={rank}".encode() for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK")}
             if rank is not None else set())
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            env = _environ(int(entry.name))
            if mine in env and (not ranks or ranks & set(env)):
                pids.append(int(entry.name))
    return pids


def kill_marked(mark: str) -> None:
    """SIGKILL whatever a test left running (a killed mpiexec may leave its ranks)."""
    for pid in marked_pids(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def train_command(config: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "rustyflow_py", "train", "--config", str(config), *flags]


def start_launcher(command: list[str], workers: int, mark: str, *,
                   out: Path | None = None, **env: str) -> subprocess.Popen[str]:
    """`mpiexec -n workers command`; its output (every rank's) to `out`, else piped."""
    args = [find_mpiexec(), "-n", str(workers), *command]
    kwargs: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stderr": subprocess.STDOUT,
                              "text": True, "env": child_env(mark, **env)}
    if out is None:
        return subprocess.Popen(args, stdout=subprocess.PIPE, **kwargs)
    with open(out, "w") as stream:  # the child keeps its own copy
        return subprocess.Popen(args, stdout=stream, **kwargs)


def launch_run(command: list[str], workers: int, *, timeout: float = RUN_TIMEOUT,
               **env: str) -> tuple[int, str, float]:
    """Launch and wait: (exit status, the launcher's and rank 0's output, seconds)."""
    mark = uuid.uuid4().hex
    start = time.monotonic()
    proc = start_launcher(command, workers, mark, **env)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the launched run did not end within {timeout} s:\n{output}")
    finally:
        kill_marked(mark)
    return proc.returncode, output, time.monotonic() - start


def signal_rank_1(proc: subprocess.Popen[Any], mark: str, signum: int, out: Path,
                  timeout: float) -> tuple[int, str, float]:
    """Send `signum` to rank 1 of the job marked `mark` and wait up to `timeout` s for the
    job's launcher `proc` to end: (its status, the output it wrote to `out`, seconds from the
    signal). A job still running then fails the test, showing its output; `proc` is killed
    either way."""
    try:
        [rank1] = marked_pids(mark, rank=1)
        os.kill(rank1, signum)
        sent = time.monotonic()
        try:
            status = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job outlived its rank 1 by {timeout:g} s:\n"
                        f"{out.read_text()[-4000:]}")
        return status, out.read_text(), time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()


def wait_until(done: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# ------------------------------------------------------------------------------ runs


class Runs:
    """The module's training runs, each made once on first use: `folder/<name>.env` is its
    config, `folder/models/<name>-cpu.npz` its checkpoint, `folder/logs/<name>.txt` its log."""

    SPECS: dict[str, tuple[int, dict[str, Any]]] = {
        "dp2": (2, {"BATCH_SIZE": 4}),
        "single8": (1, {"BATCH_SIZE": 8}),
        "single8_9": (1, {"BATCH_SIZE": 8, "MAX_STEPS": 9}),
        "accum": (1, {"BATCH_SIZE": 4, "GRAD_ACCUM_STEPS": 2}),
        "zero2": (2, {"BATCH_SIZE": 4, "SHARD_OPTIMIZER": True}),
        "dp2_accum": (2, {"BATCH_SIZE": 2, "GRAD_ACCUM_STEPS": 2}),
        "zero2_accum": (2, {"BATCH_SIZE": 2, "GRAD_ACCUM_STEPS": 2, "SHARD_OPTIMIZER": True}),
        "dp3": (3, {"BATCH_SIZE": 2, "GRAD_ACCUM_STEPS": 2}),
        "zero3": (3, {"BATCH_SIZE": 2, "GRAD_ACCUM_STEPS": 2, "SHARD_OPTIMIZER": True}),
        "single12": (1, {"BATCH_SIZE": 12}),
        "dp4": (4, {"BATCH_SIZE": 2}),
    }

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.corpus = folder / "corpus.txt"
        self.corpus.write_text(corpus_text())
        self.done: dict[str, Checkpoint] = {}

    def config(self, name: str, **keys: Any) -> Path:
        """Write `name`.env: BASE, the corpus, this run's outputs, then `keys`."""
        values = {**BASE, "DATASET": str(self.corpus),
                  "LOG_FILE": str(self.folder / "logs" / f"{name}.txt"),
                  "MODEL_PATH": str(self.folder / "models" / f"{name}.npz"), **keys}
        path = self.folder / f"{name}.env"
        path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        return path

    def checkpoint_path(self, name: str) -> Path:
        return self.folder / "models" / f"{name}-cpu.npz"

    def log_path(self, name: str) -> Path:
        return self.folder / "logs" / f"{name}.txt"

    def train(self, name: str, workers: int, resume: Path | None = None,
              **keys: Any) -> Checkpoint:
        """Run `name` (in this process when `workers` is 1, else launched); its checkpoint. A
        resumed run writes its own checkpoint, named by a typed --model-path (without it, it
        would go on writing the file it resumed)."""
        config = self.config(name, **keys)
        own = {"MODEL_PATH": str(self.checkpoint_path(name))} if resume else {}
        if workers == 1:
            cfg, warnings = load_config(config, own, environ={})
            assert warnings == []
            Trainer(cfg, lambda _: None, resume=str(resume) if resume else None).run()
        else:
            if not HAVE_MPI:
                pytest.skip("needs MPI: pip install -e '.[mpi]'")
            flags = (["--resume", str(resume), "--model-path", own["MODEL_PATH"]] if resume
                     else [])
            status, output, _ = launch_run(train_command(config, *flags), workers)
            assert status == 0, output
        return Checkpoint(self.checkpoint_path(name))

    def __getitem__(self, name: str) -> Checkpoint:
        if name not in self.done:
            workers, keys = self.SPECS[name]
            self.done[name] = self.train(name, workers, **keys)
        return self.done[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("dp"))


@pytest.fixture(autouse=True)
def no_config_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process runs and the CLI see no config keys or launcher variables of ours."""
    for key in os.environ:
        if key in KEYS or key.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RUSTYFLOW_DISABLE_GPU", "1")


def losses(ckpt: Checkpoint) -> list[float]:
    return list(ckpt.meta["train"]["losses"])


def assert_same_losses(got: Checkpoint, want: Checkpoint, steps: int = STEPS) -> None:
    """Step by step to a relative 1e-4 (fp32 sums in another order differ in the last bits)."""
    a, b = losses(got), losses(want)
    assert len(a) >= steps and len(b) >= steps, (len(a), len(b))
    np.testing.assert_allclose(a[:steps], b[:steps], rtol=1e-4, atol=0,
                               err_msg=f"{got.path.name} vs {want.path.name}")


def assert_same_weights(got: Checkpoint, want: Checkpoint) -> None:
    """Loosely: Adam turns rounding noise in near-zero gradients (the attention's key bias
    has none at all) into whole steps, so single elements differ by up to ~5e-5 here, and up
    to ~6e-4 when a loaded machine lets an interrupted run go on ~30 steps before it stops; a
    step of LEARNING_RATE is 1e-2. Elementwise to a tenth of a step, and the whole model to
    1e-4 in norm."""
    assert got.weights.keys() == want.weights.keys()
    where = f"{got.path.name} vs {want.path.name}"
    for name, w in want.weights.items():
        np.testing.assert_allclose(got.weights[name], w, rtol=0, atol=1e-3,
                                   err_msg=f"{name}: {where}")
    a = np.concatenate([got.weights[n].ravel() for n in sorted(want.weights)])
    b = np.concatenate([want.weights[n].ravel() for n in sorted(want.weights)])
    ratio = np.linalg.norm(a - b) / np.linalg.norm(b)
    assert ratio <= 1e-4, f"{where}: relative difference {ratio:.2e}"


# ------------------------------------------------------------------------------ equivalence


def test_two_ranks_equal_one_process_of_twice_the_batch_and_accumulation(runs: Runs) -> None:
    dp2, single8, accum = runs["dp2"], runs["single8"], runs["accum"]
    assert len(losses(dp2)) == STEPS
    assert losses(dp2)[0] != losses(dp2)[-1]  # it trained: the comparison is not vacuous
    assert_same_losses(dp2, single8)
    assert_same_losses(accum, single8)
    assert_same_weights(dp2, single8)
    assert_same_weights(accum, single8)
    assert dp2.meta["world_size"] == 2 and single8.meta["world_size"] == 1
    # only rank 0 writes: one log block, one record, naming the two processes
    assert runs.log_path("dp2").read_text().count(BLOCK_START) == 1
    [record] = read_log(runs.log_path("dp2"))
    assert record["status"] == "completed" and record["steps"] == STEPS
    parallel = record["parallel"]
    assert (parallel["world_size"], parallel["effective_batch"]) == (2, 8)
    assert parallel["launcher"] == "mpiexec" and parallel["buckets"] > 1


def test_two_ranks_with_accumulation_and_zero1_on_and_off_equal_one_process(
        runs: Runs) -> None:
    """2 ranks x BATCH_SIZE 2 x GRAD_ACCUM_STEPS 2, ZeRO-1 off and on: the 1-process run of
    BATCH_SIZE 8, step by step."""
    for name in ("dp2_accum", "zero2_accum"):
        assert_same_losses(runs[name], runs["single8"])
        assert_same_weights(runs[name], runs["single8"])
        [record] = read_log(runs.log_path(name))
        parallel = record["parallel"]
        assert (parallel["world_size"], parallel["grad_accum_steps"]) == (2, 2)
        assert parallel["effective_batch"] == 8
        assert parallel["shard_optimizer"] is (name == "zero2_accum")


def test_three_ranks_with_accumulation_equal_one_process_of_the_whole_batch(
        runs: Runs) -> None:
    dp3, single12 = runs["dp3"], runs["single12"]
    assert_same_losses(dp3, single12)
    assert_same_weights(dp3, single12)
    [record] = read_log(runs.log_path("dp3"))
    assert record["parallel"]["effective_batch"] == 12
    assert record["parallel"]["grad_accum_steps"] == 2


def test_four_ranks_equal_one_process_of_the_whole_batch(runs: Runs) -> None:
    assert_same_losses(runs["dp4"], runs["single8"])
    assert_same_weights(runs["dp4"], runs["single8"])


def test_zero1_trains_like_plain_data_parallel(runs: Runs) -> None:
    zero2, dp2 = runs["zero2"], runs["dp2"]
    assert_same_losses(zero2, dp2)
    assert_same_weights(zero2, dp2)
    [record] = read_log(runs.log_path("zero2"))
    assert record["parallel"]["shard_optimizer"] is True


def test_zero1_on_three_ranks_pads_the_shards_and_still_matches(runs: Runs) -> None:
    zero3 = runs["zero3"]
    params = sum(w.size for w in zero3.weights.values())
    assert params % 3, "the model should not split evenly in 3: the padding is the point"
    assert_same_losses(zero3, runs["single12"])
    assert_same_weights(zero3, runs["dp3"])
    for name, state in runs["dp3"].optimizer.items():
        assert zero3.optimizer[name].shape == state.shape, name


# ------------------------------------------------------------------------------ ZeRO-1 state


def test_zero1_checkpoint_holds_the_full_optimizer_state(runs: Runs) -> None:
    zero2, dp2, single8 = runs["zero2"], runs["dp2"], runs["single8"]
    assert set(zero2.optimizer) == set(single8.optimizer) == {"m", "v", "step_count"}
    for name, state in single8.optimizer.items():
        assert zero2.optimizer[name].shape == state.shape, name
        assert zero2.optimizer[name].dtype == state.dtype, name
    assert int(zero2.optimizer["step_count"]) == STEPS
    for name in ("m", "v"):
        got, want = zero2.optimizer[name], dp2.optimizer[name]
        assert np.count_nonzero(got) > 0.9 * got.size  # every shard's part, not only rank 0's
        scale = np.abs(want).max()
        assert np.abs(got - want).max() <= 1e-3 * scale, name


def test_zero1_checkpoint_resumes_on_one_process_with_the_same_global_batch(
        runs: Runs) -> None:
    resumed = runs.train("zero2_to_1", 1, resume=runs.checkpoint_path("zero2"), BATCH_SIZE=8,
                         MAX_STEPS=9)
    assert len(losses(resumed)) == 9
    assert losses(resumed)[:STEPS] == losses(runs["zero2"])
    assert_same_losses(resumed, runs["single8_9"], steps=9)
    assert_same_weights(resumed, runs["single8_9"])


def test_one_process_checkpoint_resumes_on_two_zero1_ranks(runs: Runs) -> None:
    """The other way: a full state loaded into shards (load_state_dict of ZeRO-1)."""
    runs["single8"]
    resumed = runs.train("one_to_zero2", 2, resume=runs.checkpoint_path("single8"),
                         BATCH_SIZE=4, SHARD_OPTIMIZER=True, MAX_STEPS=9)
    assert resumed.meta["world_size"] == 2
    assert_same_losses(resumed, runs["single8_9"], steps=9)
    assert_same_weights(resumed, runs["single8_9"])


# ------------------------------------------------------------------------------ resume


def test_resume_at_another_world_size_with_the_same_global_batch(runs: Runs) -> None:
    resumed = runs.train("dp2_to_1", 1, resume=runs.checkpoint_path("dp2"), BATCH_SIZE=8,
                         MAX_STEPS=9)
    assert resumed.meta["world_size"] == 1
    assert losses(resumed)[:STEPS] == losses(runs["dp2"])
    assert_same_losses(resumed, runs["single8_9"], steps=9)
    assert_same_weights(resumed, runs["single8_9"])


def test_resume_with_another_global_batch_is_refused_naming_the_numbers(runs: Runs) -> None:
    runs["dp2"]
    config = runs.config("refused_1", BATCH_SIZE=4, MAX_STEPS=9)
    result = CliRunner().invoke(main, ["train", "--config", str(config), "--resume",
                                       str(runs.checkpoint_path("dp2"))])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "the checkpoint's steps each took 8 token streams" in text
    assert "BATCH_SIZE=4 x GRAD_ACCUM_STEPS=1 x 2 processes" in text
    assert "this run's take 4 (BATCH_SIZE=4 x GRAD_ACCUM_STEPS=1 x 1 process)" in text
    assert "product is 8" in text
    assert not runs.checkpoint_path("refused_1").exists()


def test_resume_refused_on_more_ranks_stops_every_rank(runs: Runs) -> None:
    runs["dp2"]
    config = runs.config("refused_3", BATCH_SIZE=4, MAX_STEPS=9)
    status, output, seconds = launch_run(
        train_command(config, "--resume", str(runs.checkpoint_path("dp2"))), 3)
    assert status != 0, output  # 1, or 9 when mpiexec reports a rank it killed after
    text = " ".join(output.split())
    assert "took 8 token streams" in text and "this run's take 12" in text, output
    assert "x 3 processes" in text and "product is 8" in text, output
    assert seconds < 60
    assert not runs.checkpoint_path("refused_3").exists()


# ------------------------------------------------------------------------------ failures


def test_a_rank_configured_differently_fails_the_run_naming_the_key(runs: Runs) -> None:
    config = runs.config("mismatch", BATCH_SIZE=4)
    shell = 'if [ "$PMI_RANK" = 1 ]; then export LEARNING_RATE=0.02; fi; exec "$0" "$@"'
    status, output, seconds = launch_run(["sh", "-c", shell, *train_command(config)], 2)
    assert status != 0, output  # 1, or 9 when mpiexec reports a rank it killed after
    assert seconds < 60
    failed = [line for line in output.splitlines() if "configured differently" in line]
    assert failed, output
    line = failed[0]  # the first rank to fail: either one, each sees the difference
    assert line.startswith("Error: rank ") and " failed: " in line
    assert "configured differently" in line and "start every process with the same" in line
    assert "rank 0" in line and "rank 1" in line
    assert "LEARNING_RATE=" in line and "0.02" in line and "0.01" in line, line
    assert not runs.checkpoint_path("mismatch").exists()
    assert not runs.log_path("mismatch").exists()


def test_a_rank_that_fails_after_joining_ends_the_job_naming_it(runs: Runs) -> None:
    """Rank 1 runs in another folder, where DATASET (a relative path) names a text too short
    for the batch: the config is the same everywhere, so rank 1 fails only after joining, in
    check_layout, while rank 0 is on its way to the first collective: rank 1 says why and
    aborts the job, which ends rank 0 too."""
    elsewhere = runs.folder / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    (elsewhere / "corpus.txt").write_text("a b c\n" * 20)
    config = runs.config("short_data", BATCH_SIZE=4, DATASET="corpus.txt")
    shell = (f"cd {shlex.quote(str(runs.folder))} && "
             'if [ "$PMI_RANK" = 1 ]; then cd elsewhere; fi; exec "$0" "$@"')
    status, output, seconds = launch_run(["sh", "-c", shell, *train_command(config)], 2)
    assert status != 0, output  # 1, or 9 when mpiexec reports a rank it killed after
    assert seconds < 60
    warning = next((line for line in output.splitlines() if "Error: rank 1 failed: " in line),
                   "")
    assert "too few for BATCH_SIZE=4 x 2 processes = 8 streams" in warning, output
    assert not runs.checkpoint_path("short_data").exists()


def test_a_rank_that_fails_before_joining_ends_the_job_naming_it(runs: Runs) -> None:
    """A bad flag on rank 1 only: it fails in the command line, before it has joined the run,
    while rank 0 goes on into MPI; rank 1 still ends the job instead of leaving rank 0 to
    wait for it for ever."""
    config = runs.config("bad_flag", BATCH_SIZE=4, NUM_EPOCHS=1000, MAX_STEPS=0)
    shell = 'if [ "$PMI_RANK" = 1 ]; then set -- "$@" --seq-len x; fi; exec "$0" "$@"'
    status, output, seconds = launch_run(["sh", "-c", shell, *train_command(config)], 2)
    assert status != 0, output
    assert seconds < 60
    line = next((x for x in output.splitlines() if x.startswith("Error: rank 1 failed: ")), "")
    assert "SEQ_LEN='x' is not valid" in line, output
    assert not runs.checkpoint_path("bad_flag").exists()


def start_training(runs: Runs, name: str, mark: str, until: str, *,
                   via_launcher: bool = False,
                   **keys: Any) -> tuple[subprocess.Popen[str], Path, Path]:
    """A long run on 2 ranks (1000 epochs of ~23 steps), returned once `until` has shown (a
    checkpoint's path, or a line of the output to wait for): under mpiexec, or `via_launcher`
    as `rustyflow train --processes 2` (rustyflow's own launcher, as for --gpus, on the CPU).
    (mpiexec or rustyflow, checkpoint, its output file)"""
    config = runs.config(name, BATCH_SIZE=4, NUM_EPOCHS=1000, MAX_STEPS=0, **keys)
    out = runs.folder / f"{name}.out"
    if via_launcher:
        with open(out, "w") as stream:
            proc = subprocess.Popen([*train_command(config), "--processes", "2"], stdout=stream,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    text=True, env=child_env(mark))
    else:
        proc = start_launcher(train_command(config), 2, mark, out=out)
    ckpt = runs.checkpoint_path(name)

    def shown() -> bool:
        return ckpt.exists() if until == "checkpoint" else until in out.read_text()

    wait_until(lambda: shown() or proc.poll() is not None, until)
    assert proc.poll() is None, out.read_text()
    return proc, ckpt, out


@pytest.fixture
def mark() -> Iterator[str]:
    value = uuid.uuid4().hex
    yield value
    kill_marked(value)


@needs_mpi
def test_a_sigkilled_rank_ends_the_job_naming_it_through_the_launcher(runs: Runs,
                                                                      mark: str) -> None:
    """`rustyflow train --processes 2` (the launcher of --gpus, on the CPU): mpiexec kills the
    job when rank 1 dies, and the launcher turns its report into one line naming the rank,
    in place of MPI's own (Hydra's BAD TERMINATION banner and exit codes)."""
    proc, ckpt, out = start_training(runs, "sigkill", mark, "checkpoint", via_launcher=True)
    status, output, _ = signal_rank_1(proc, mark, signal.SIGKILL, out, 30)
    assert status != 0, output
    assert "Error: rank 1 was killed by SIGKILL" in output, output
    assert output.count("Error:") == 1, output
    assert "BAD TERMINATION" not in output and "[mpiexec@" not in output, output
    assert not marked_pids(mark), "a rank was left behind"
    saved = Checkpoint(ckpt)  # atomically written: whole, whenever the kill landed
    assert saved.meta["world_size"] == 2 and saved.meta["train"]["step"] > 0
    assert all(np.isfinite(w).all() for w in saved.weights.values())


@needs_mpi
def test_killing_the_launcher_itself_stops_the_ranks_it_started(runs: Runs, mark: str) -> None:
    """`rustyflow train --processes 2` SIGKILLed (no chance to forward anything): mpiexec gets
    a SIGTERM from the kernel as its parent dies (or SIGPIPE at its next line of output), and
    no process of the job is left running."""
    proc, ckpt, _ = start_training(runs, "orphans", mark, "checkpoint", via_launcher=True)
    assert len(marked_pids(mark, rank=0)) == len(marked_pids(mark, rank=1)) == 1
    proc.kill()
    proc.wait()
    wait_until(lambda: not marked_pids(mark), "the ranks to stop", 60)
    Checkpoint(ckpt)


@needs_mpi
def test_a_stopped_rank_ends_the_job_within_the_timeout_naming_it(runs: Runs,
                                                                    mark: str) -> None:
    """SIGSTOP: rank 1 neither dies nor answers. Rank 0's heartbeat notices within
    COMM_TIMEOUT, names rank 1 and aborts the job; mpiexec then kills the stopped rank too."""
    timeout = 5.0
    proc, ckpt, out = start_training(runs, "sigstop", mark, "checkpoint",
                                     COMM_TIMEOUT=timeout)
    status, output, seconds = signal_rank_1(proc, mark, signal.SIGSTOP, out, timeout + 30)
    assert status != 0, output
    assert seconds < timeout + 10, output  # found within COMM_TIMEOUT, then the teardown
    assert re.search(r"Error: rank 1 has been silent for [\d.]+ s \(COMM_TIMEOUT=5\)", output), \
        output
    assert "rank 0 ends the job" in output, output
    wait_until(lambda: not marked_pids(mark), "mpiexec to kill the stopped rank", 10)
    Checkpoint(ckpt)


@needs_mpi
def test_sigterm_to_the_launcher_interrupts_once_and_resumes(runs: Runs, mark: str) -> None:
    """SIGTERM to `rustyflow train --processes 2`, which forwards it to mpiexec, which forwards
    it to each rank; ZeRO-1, so the interrupted save also gathers the optimizer's shards."""
    proc, ckpt, out = start_training(runs, "sigterm", mark, "  step 2 (", via_launcher=True,
                                     SHARD_OPTIMIZER=True)
    try:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    output = out.read_text()
    assert status == 143, output
    assert "Error:" not in output, output  # a stop is no failure
    text = runs.log_path("sigterm").read_text()
    assert text.count(BLOCK_START) == 1, text
    [record] = read_log(runs.log_path("sigterm"))
    assert record["status"] == "interrupted", record
    saved = Checkpoint(ckpt)
    stopped = saved.meta["train"]["step"]
    assert stopped == record["steps"] == len(losses(saved)) > 0
    assert saved.optimizer["m"].size == sum(w.size for w in saved.weights.values())

    # resume on one process with the same global batch, a few steps further...
    target = stopped + 3
    resumed = runs.train("sigterm_resumed", 1, resume=ckpt, BATCH_SIZE=8, NUM_EPOCHS=1000,
                         MAX_STEPS=target)
    # ...and it is the run that was never interrupted
    straight = runs.train("sigterm_straight", 1, BATCH_SIZE=8, NUM_EPOCHS=1000,
                          MAX_STEPS=target)
    assert len(losses(resumed)) == target
    assert losses(resumed)[:stopped] == losses(saved)
    # (this random-word corpus turns chaotic near step 43: rounding differences between any
    # two batch layouts, even 1 x B8 and 1 x B4 x 2 micro-steps, then grow to 1e-2)
    assert_same_losses(resumed, straight, steps=min(target, 40))
    if target <= 20:  # the weights drift apart faster than the losses (see assert_same_weights)
        assert_same_weights(resumed, straight)


# ------------------------------------------------------------------------------ the CLI


def test_gpus_with_the_cpu_device_is_refused(runs: Runs) -> None:
    config = runs.config("cli_cpu", BATCH_SIZE=4)
    result = CliRunner().invoke(main, ["train", "--config", str(config), "--gpus", "2",
                                       "--device", "cpu"])
    assert result.exit_code == 1, result.output
    assert "NUM_GPUS=2" in result.output and "DEVICE=cpu" in result.output
    assert "starting" not in result.output  # nothing was launched


def test_gpus_that_disagree_with_the_launchers_process_count_are_refused(runs: Runs) -> None:
    cfg, _ = load_config(runs.config("cli_world", BATCH_SIZE=4, DEVICE="auto", NUM_GPUS=2),
                         environ={})
    with pytest.raises(ConfigError) as info:
        check_world(cfg, World(rank=0, size=3, launcher="mpiexec"))
    assert "NUM_GPUS=2 but the launcher (mpiexec) started 3 processes" in str(info.value)


def test_check_world_accepts_agreement_and_refuses_gpus_without_a_launcher(
        runs: Runs) -> None:
    cfg, _ = load_config(runs.config("world", BATCH_SIZE=4, DEVICE="auto", NUM_GPUS=3),
                         environ={})
    check_world(cfg, World(rank=1, size=3, launcher="mpiexec"))  # agrees: fine
    with pytest.raises(ConfigError, match="NUM_GPUS=3 needs one process per GPU"):
        check_world(cfg, World())


def test_gpus_without_mpi_is_a_clear_error_naming_the_extra(
        runs: Runs, monkeypatch: pytest.MonkeyPatch) -> None:
    """No mpi4py (None in sys.modules makes its import fail) and no RUSTYFLOW_MPIEXEC."""
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    monkeypatch.delenv("RUSTYFLOW_MPIEXEC", raising=False)
    config = runs.config("no_mpi", BATCH_SIZE=4)
    result = CliRunner().invoke(main, ["train", "--config", str(config), "--processes", "2"])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "mpi4py is not installed" in text, text
    assert EXTRA_HINT in text and "[mpi]" in EXTRA_HINT, text
    assert "Traceback" not in result.output
    assert not runs.checkpoint_path("no_mpi").exists()


@needs_mpi
def test_train_processes_launches_the_workers_itself(runs: Runs) -> None:
    """`rustyflow train --processes 2` starts its own command line under `mpiexec -n 2`
    (as --gpus 2 does on GPUs), each rank on the CPU: the same run as dp2."""
    runs["dp2"]
    config = runs.config("cli_launch", BATCH_SIZE=4)
    mark = uuid.uuid4().hex
    try:
        result = subprocess.run(
            [*train_command(config), "--processes", "2"], stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=RUN_TIMEOUT, env=child_env(mark))
    finally:
        kill_marked(mark)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "starting 2 processes: " in result.stderr and " -n 2 " in result.stderr
    ckpt = Checkpoint(runs.checkpoint_path("cli_launch"))
    assert ckpt.meta["world_size"] == 2
    assert_same_losses(ckpt, runs["dp2"])


# ------------------------------------------------------------------------------ units


@pytest.mark.parametrize(("world", "accum"), [(1, 2), (2, 1), (2, 2), (3, 2), (4, 1)])
def test_the_shards_of_a_step_partition_its_global_batch(world: int, accum: int) -> None:
    backend = get_backend("cpu")
    kernels, xp = backend.kernels, backend.xp
    b, t, n = 2, 8, 60
    rows = world * accum * b
    stream = backend.from_host(
        np.random.default_rng(1).integers(0, 1000, (rows, n)).astype(np.int32))
    for s in (0, 3, 9):  # 9 wraps: 7 windows per epoch
        step = xp.asarray(s, dtype=np.int32)
        whole_x = xp.zeros((rows, t), np.int32)
        whole_y = xp.zeros_like(whole_x)
        kernels.gather_batch(stream, step, t, whole_x, whole_y)
        parts_x, parts_y = {}, {}
        for rank in range(world):
            for k in range(accum):  # the step runner's numbering of its micro-steps
                shard = rank * accum + k
                x, y = xp.zeros((b, t), np.int32), xp.zeros((b, t), np.int32)
                kernels.gather_batch(stream, step, t, x, y, rank=shard,
                                     world_size=world * accum)
                parts_x[shard], parts_y[shard] = backend.to_host(x), backend.to_host(y)
        assert sorted(parts_x) == list(range(world * accum))
        union_x = np.concatenate([parts_x[i] for i in sorted(parts_x)])
        union_y = np.concatenate([parts_y[i] for i in sorted(parts_y)])
        np.testing.assert_array_equal(union_x, backend.to_host(whole_x))
        np.testing.assert_array_equal(union_y, backend.to_host(whole_y))
        # no overlap: each shard's rows are distinct stream rows (the tokens are random)
        assert len({r.tobytes() for r in union_x}) == rows
        np.testing.assert_array_equal(union_x[:, 1:], union_y[:, :-1])


def test_gather_batch_refuses_a_stream_of_another_world_size() -> None:
    backend = get_backend("cpu")
    stream = backend.from_host(np.zeros((6, 40), np.int32))
    x = np.zeros((2, 8), np.int32)
    with pytest.raises(ValueError, match="rank 0 of 2 with 2 rows each"):
        backend.kernels.gather_batch(stream, np.asarray(0, np.int32), 8, x, x.copy(),
                                     rank=0, world_size=2)


class DoublingComm:
    """A world-size-1 stand-in for a communicator whose "sum over ranks" doubles the array
    in place, and which records which part of the gradient buffer each call reduced."""

    def __init__(self, grad: np.ndarray, events: list[tuple[str, Any]]) -> None:
        self.base, self.events = grad, events

    def all_reduce(self, x: np.ndarray, stream: Any = None) -> None:
        assert np.shares_memory(x, self.base)  # in place, on the buffer itself
        start = (x.ctypes.data - self.base.ctypes.data) // x.itemsize
        self.events.append(("reduce", (start, start + x.size)))
        x *= 2


def tiny_gpt(layers: int = 2) -> GPT:
    return GPT(GPTConfig(vocab_size=50, seq_len=8, n_layer=layers, n_head=2, n_embd=16),
               "cpu", seed=3)


def backward_once(model: GPT, on_leaf: Callable[[Tensor], None] | None = None) -> None:
    rng = np.random.default_rng(5)
    x = rng.integers(0, 50, (3, 8)).astype(np.int32)
    y = rng.integers(0, 50, (3, 8)).astype(np.int32)
    model.buffer.zero_grad()
    model(Tensor(x), Tensor(y)).backward(on_leaf=on_leaf)


def bucket_owner(buffer: Any, buckets: list[tuple[int, int]]) -> dict[str, int]:
    """Each tensor's bucket, asserting that it lies wholly inside exactly one."""
    owner = {}
    for span in buffer.spans:
        [i] = [k for k, (lo, hi) in enumerate(buckets)
               if lo <= span.offset and span.offset + span.size <= hi]
        owner[span.name] = i
    return owner


def recorded_backward(model: GPT, sync: BucketedAllReduce, events: list[tuple[str, Any]],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """One backward with `sync` armed, recording into `events`, in order: ("grad", name) as
    backward adds a gradient into a parameter (by `_accumulate`, or by an op given the
    parameter's buffer through `grad_buffers`), ("leaf", name) as backward reports that
    parameter complete, and (from DoublingComm) ("reduce", span) for every all-reduce."""
    name_of = {id(t): name for name, t in model.buffer.params.items()}
    real_accumulate = Tensor._accumulate
    real_grad_buffers = Function.grad_buffers

    def accumulate(self: Tensor, g: Any) -> None:
        if id(self) in name_of:
            events.append(("grad", name_of[id(self)]))
        real_accumulate(self, g)

    def grad_buffers(self: Function, *inputs: int) -> tuple[Any, ...]:
        buffers = real_grad_buffers(self, *inputs)
        for i, buffer in zip(inputs, buffers, strict=True):
            if buffer is not None and id(self.parents[i]) in name_of:
                events.append(("grad", name_of[id(self.parents[i])]))
        return buffers

    hook = sync.start(overlap=True)

    def on_leaf(t: Tensor) -> None:
        if id(t) in name_of:
            events.append(("leaf", name_of[id(t)]))
        hook(t)

    with monkeypatch.context() as m:
        m.setattr(Tensor, "_accumulate", accumulate)
        m.setattr(Function, "grad_buffers", grad_buffers)
        backward_once(model, on_leaf)


def test_bucketed_all_reduce_reduces_each_bucket_once_when_its_tensors_are_complete(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reference = tiny_gpt()
    backward_once(reference)
    want = reference.buffer.grad.copy()

    model = tiny_gpt()
    buffer = model.buffer
    events: list[tuple[str, Any]] = []
    sync = BucketedAllReduce(buffer, DoublingComm(buffer.grad, events), bucket_bytes=4096)
    buckets = sync.buckets

    # the buckets tile the buffer with whole tensors, each tensor in exactly one
    assert len(buckets) > 3
    assert buckets[0][0] == 0 and buckets[-1][1] == buffer.flat.size
    assert all(a[1] == b[0] for a, b in zip(buckets, buckets[1:], strict=False))
    owner = bucket_owner(buffer, buckets)
    assert sorted(set(owner.values())) == list(range(len(buckets)))

    for _ in range(2):  # armed afresh for every backward
        events.clear()
        recorded_backward(model, sync, events, monkeypatch)
        during = len(events)
        sync.finish()
        assert len(events) == during  # backward reached every tensor: nothing left to finish

        reduced = [span for kind, span in events if kind == "reduce"]
        assert sorted(reduced) == buckets  # each bucket exactly once
        np.testing.assert_allclose(buffer.grad, 2 * want, rtol=1e-6, atol=1e-9)

        for i, (kind, what) in enumerate(events):
            if kind == "reduce":  # right after its last tensor is reported complete...
                k = buckets.index(what)
                complete = {name for kind2, name in events[:i] if kind2 == "leaf"}
                assert {n for n, b in owner.items() if b == k} <= complete
                assert events[i - 1][0] == "leaf" and owner[events[i - 1][1]] == k
            if kind == "grad":  # ...and never before a gradient lands in it
                assert ("reduce", buckets[owner[what]]) not in events[:i], what


def test_bucketed_all_reduce_starts_the_last_layers_buckets_during_backward(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_gpt()
    events: list[tuple[str, Any]] = []
    sync = BucketedAllReduce(model.buffer, DoublingComm(model.buffer.grad, events), 4096)
    owner = bucket_owner(model.buffer, sync.buckets)
    recorded_backward(model, sync, events, monkeypatch)
    sync.finish()
    last_layer = ({owner[n] for n in owner if n.startswith("h.1.")}
                  - {owner[n] for n in owner if not n.startswith("h.1.")})
    assert last_layer, "expected a bucket holding only the last layer's tensors"
    first_layer_grad = next(i for i, (kind, name) in enumerate(events)
                            if kind == "grad" and name.startswith("h.0."))
    for k in last_layer:  # reduced before backward has reached the first layer
        assert events.index(("reduce", sync.buckets[k])) < first_layer_grad
    # and every tensor is reported complete as soon as the op that gave it its last gradient
    # is done (that op may still give its other inputs, a weight's bias, their gradients
    # first; the MLP is one op with both layers' weights and biases)
    def op_of(name: str) -> str:
        return re.sub(r"mlp\.c_(fc|proj)$", "mlp", name.rsplit(".", 1)[0])

    for name in owner:
        last_grad = max(i for i, e in enumerate(events) if e == ("grad", name))
        later = [other for kind, other in events[last_grad + 1 : events.index(("leaf", name))]
                 if kind == "grad" and op_of(other) != op_of(name)]
        assert not later, (name, later)


def test_bucketed_all_reduce_finish_reduces_buckets_backward_never_reached() -> None:
    model = tiny_gpt(layers=1)
    events: list[tuple[str, Any]] = []
    sync = BucketedAllReduce(model.buffer, DoublingComm(model.buffer.grad, events), 4096)
    model.buffer.grad[...] = 1.0
    sync.start(overlap=False)  # and no backward at all (every tensor unused)
    sync.finish()
    assert sorted(span for _, span in events) == sync.buckets
    np.testing.assert_array_equal(model.buffer.grad, 2.0)


class Bf16DoublingComm:
    """Two ranks of equal gradients, summed in bf16 (as NCCL sums a bf16 buffer): the
    collective sees only the wire copy, never the float32 gradient, and doubles it (exact in
    bf16, so what comes back is 2 x the gradient rounded to bf16 once)."""

    size = 2

    def __init__(self, grad: np.ndarray) -> None:
        self.grad, self.calls, self.rank = grad, 0, 0

    def _check(self, x: np.ndarray) -> None:
        assert x.dtype.name == "bfloat16" and not np.shares_memory(x, self.grad)
        self.calls += 1

    def all_reduce(self, x: np.ndarray, stream: Any = None) -> None:
        self._check(x)
        x[...] = (x.astype(np.float32) * 2).astype(x.dtype)

    def shard(self, x: np.ndarray) -> slice:
        n = x.size // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def reduce_scatter(self, x: np.ndarray, stream: Any = None) -> None:
        self._check(x)
        mine = self.shard(x)
        x[mine] = (x[mine].astype(np.float32) * 2).astype(x.dtype)
        x[: mine.start] = x[mine.stop :] = np.nan  # the other shards: scratch


def bf16_and_a_gradient() -> tuple[np.dtype, Any, np.ndarray]:
    """bf16's dtype, and a tiny model's buffer after one backward with a copy of its
    gradient."""
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    model = tiny_gpt()
    backward_once(model)
    return bf16, model.buffer, model.buffer.grad.copy()


def test_grad_reduce_dtype_bf16_sums_each_bucket_in_bf16_and_widens_it_back() -> None:
    bf16, buffer, g = bf16_and_a_gradient()
    want = 2 * g.astype(bf16).astype(np.float32)
    assert not np.array_equal(want, 2 * g)  # the rounding is visible at this size

    comm = Bf16DoublingComm(buffer.grad)
    sync = BucketedAllReduce(buffer, comm, 4096, bf16)
    assert sync.wire.copy is not None
    # BUCKET_MB counts the bytes on the wire: twice the elements of a float32 bucket
    assert len(sync.buckets) < len(BucketedAllReduce(buffer, comm, 4096).buckets)
    assert sync.buckets == buffer.buckets(4096, itemsize=2)
    sync.start(overlap=True)
    sync.finish()  # no backward armed: every bucket is reduced here
    assert comm.calls == len(sync.buckets)
    assert buffer.grad.dtype == np.float32
    np.testing.assert_array_equal(buffer.grad, want)

    # the profile counts each bucket's own bytes: its float32 gradient and its bf16 view, not
    # the wire's whole copy
    from rustyflow_py.engine.profiler import Profiler

    prof = Profiler(buffer.backend)
    with prof:
        sync.start(overlap=False)
        sync.finish()
    for k, (start, stop) in enumerate(sync.buckets):
        assert prof.costs[(f"all_reduce[{k}]", "backward", "comm")][1] == (stop - start) * 6


class Bf16Reader:
    """An optimizer that takes a bf16 gradient (AdamW on the GPU), as the all-reduce sees it."""

    reads_bf16_grad = True
    summed_grad: Any = None


def test_an_optimizer_that_reads_bf16_is_handed_the_summed_copy_and_nothing_is_widened() -> None:
    from rustyflow_py.model.optim import AdamW, Schedule

    bf16, buffer, g = bf16_and_a_gradient()
    sync = BucketedAllReduce(buffer, Bf16DoublingComm(buffer.grad), 4096, bf16)
    on_cpu = AdamW(buffer, Schedule(1e-3, 1, 10, 0.1))
    sync.hand_to(on_cpu)  # the CPU's AdamW takes float32 only: it keeps the widened gradient
    assert not on_cpu.reads_bf16_grad and on_cpu.summed_grad is None
    assert on_cpu.grad is buffer.grad and sync.wire.widen

    reader = Bf16Reader()
    sync.hand_to(reader)
    sync.start(overlap=True)
    sync.finish()
    assert not sync.wire.widen
    summed = reader.summed_grad
    assert summed.dtype == bf16 and summed.size == buffer.grad.size
    assert np.shares_memory(summed, sync.wire.copy)  # read where the collective left it
    np.testing.assert_array_equal(summed.astype(np.float32), 2 * g.astype(bf16).astype(np.float32))
    np.testing.assert_array_equal(buffer.grad, g)  # no widening pass wrote the gradient


@pytest.mark.parametrize("rank", [0, 1])
def test_zero1_with_grad_reduce_dtype_bf16_widens_back_only_this_ranks_shard(rank: int) -> None:
    """The whole gradient reduce-scattered in bf16; only this rank's shard is summed, and only
    it is widened back into the float32 gradient (the other shards stay as they were)."""
    from rustyflow_py.distributed.data_parallel import ReduceScatter

    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    model = tiny_gpt()
    backward_once(model)
    buffer = model.buffer
    g = buffer.grad_storage.copy()
    comm = Bf16DoublingComm(buffer.grad)
    comm.rank = rank
    ReduceScatter(buffer, comm, bf16).finish()
    mine = comm.shard(buffer.grad_storage)
    assert comm.calls == 1 and mine.start == rank * (g.size // 2)
    np.testing.assert_array_equal(buffer.grad_storage[mine],
                                  2 * g[mine].astype(bf16).astype(np.float32))
    outside = np.ones(g.size, bool)
    outside[mine] = False  # the other shards: NaN scratch on the wire, never widened back
    np.testing.assert_array_equal(buffer.grad_storage[outside], g[outside])


def test_grad_reduce_dtype_bf16_on_the_cpu_is_refused_naming_both_ways_out(tmp_path: Path) -> None:
    config = tmp_path / "c.env"
    config.write_text("DEVICE=cpu\nGRAD_REDUCE_DTYPE=bf16\n")
    with pytest.raises(ConfigError, match="GRAD_REDUCE_DTYPE=bf16 .* DEVICE=cpu .* set "
                                          "GRAD_REDUCE_DTYPE=fp32, or DEVICE=gpu"):
        load_config(str(config))



def test_reduce_dtype_warns_alone_refuses_the_cpus_and_names_the_fallback() -> None:
    from rustyflow_py.errors import TrainingError
    from rustyflow_py.training.run.parts import reduce_dtype

    said: list[str] = []
    assert reduce_dtype("fp32", "cpu", None, True, said.append) is None
    assert reduce_dtype("bf16", "gpu", None, False, said.append) is None
    assert said == ["WARN: GRAD_REDUCE_DTYPE=bf16 in a single process: nothing to sum"]
    with pytest.raises(TrainingError, match=r"processes are on the CPU \(the GPU is unusable: "
                                            r"no driver\), where MPI sums float32 only: set "
                                            r"GRAD_REDUCE_DTYPE=fp32, or train on GPUs"):
        reduce_dtype("bf16", "cpu", "no driver", True, said.append)
    bf16 = pytest.importorskip("ml_dtypes").bfloat16
    assert reduce_dtype("bf16", "gpu", None, True, said.append) == np.dtype(bf16)


def test_reduce_dtype_without_ml_dtypes_names_the_setting_and_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rustyflow_py.errors import TrainingError
    from rustyflow_py.training.run.parts import reduce_dtype

    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now fails
    with pytest.raises(TrainingError, match=r"^GRAD_REDUCE_DTYPE=bf16 needs the ml_dtypes "
                                            r"package \(bf16's NumPy dtype\), which the gpu "
                                            r"extra brings: .*gpu"):
        reduce_dtype("bf16", "gpu", None, True, print)


@pytest.mark.parametrize("rank0_ppl", [123.5, float("nan"), float("inf")])
@pytest.mark.parametrize("main", [True, False], ids=["rank0", "rank1"])
def test_every_process_checks_rank_0s_test_perplexity(rank0_ppl: float, main: bool) -> None:
    """Only rank 0 evaluates the test split; every process checks rank 0's figure (an
    all-reduce of it and the others' zeros), so a non-finite one fails them all alike and
    none is left in a collective that a failed rank 0 skips."""
    import contextlib
    from types import SimpleNamespace

    from rustyflow_py.errors import TrainingError
    from rustyflow_py.training.outputs import guard

    class WithRank0:  # an all-reduce over this process and a rank 0 holding rank0_ppl
        def all_reduce(self, x: np.ndarray, stream: Any = None) -> None:
            assert x.dtype == np.float64 and x.shape == ()
            x[...] = x + (0.0 if main else rank0_ppl)

    trainer = Trainer.__new__(Trainer)
    trainer.parts = SimpleNamespace(comm=WithRank0(), world=SimpleNamespace(main=main),
                                    backend=get_backend("cpu"),
                                    ledger=SimpleNamespace(set_aside=contextlib.nullcontext))
    got = trainer._rank0s(rank0_ppl if main else None)
    assert got == rank0_ppl or (np.isnan(got) and np.isnan(rank0_ppl))
    if np.isfinite(rank0_ppl):
        guard.check_results(100.0, got)
    else:
        with pytest.raises(TrainingError, match="final test perplexity is (nan|inf)"):
            guard.check_results(100.0, got)


def test_zero1_hands_each_rank_its_shard_of_the_summed_copy_and_widens_nothing() -> None:
    """ReduceScatter.hand_to: the sharded optimizer's inner one reads this rank's shard of the
    bf16 copy where the reduce-scatter leaves it, and the float32 gradient stays unwritten."""
    from types import SimpleNamespace

    from rustyflow_py.distributed.data_parallel import ReduceScatter

    bf16, buffer, _ = bf16_and_a_gradient()
    g = buffer.grad_storage.copy()
    comm = Bf16DoublingComm(buffer.grad)
    comm.rank = 1
    sync = ReduceScatter(buffer, comm, bf16)
    sharded = SimpleNamespace(inner=Bf16Reader(), reads_bf16_grad=True)
    sync.hand_to(sharded)
    sync.finish()
    mine = comm.shard(buffer.grad_storage)
    summed = sharded.inner.summed_grad
    assert not sync.wire.widen and summed.size == mine.stop - mine.start
    assert np.shares_memory(summed, sync.wire.copy)
    np.testing.assert_array_equal(summed.astype(np.float32),
                                  2 * g[mine].astype(bf16).astype(np.float32))
    np.testing.assert_array_equal(buffer.grad_storage, g)
