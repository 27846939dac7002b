"""Data parallelism on real GPUs (NCCL, CUDA-graph replay): skipped without the GPUs it needs.

The CPU suite (test_data_parallel.py) covers the same logic over MPI's CPU collectives; these
run it where it matters: NCCL (its id broadcast over MPI) captured in the step's graph, the
bucket all-reduce overlapping backward on a second stream, ZeRO-1's reduce-scatter/all-gather.
Every run goes through `mpiexec -n N`, as `rustyflow train --gpus N` does.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from conftest import real_data_dir
from test_data_parallel import MARK, kill_marked, marked_pids, signal_rank_1, wait_until

from rustyflow_py.distributed.launcher import launch
from rustyflow_py.engine.devices import gpu_count
from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.training.outputs.checkpoint import Checkpoint

GPUS = gpu_count()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(real_data_dir() is None, reason="needs WikiText-2 (RUSTYFLOW_DATA_DIR)"),
]
two_gpus = pytest.mark.skipif(GPUS < 2 or importlib.util.find_spec("mpi4py") is None,
                              reason=f"needs 2 GPUs (this machine has {GPUS}) and the mpi extra")
one_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a GPU")

TINY = ["--num-layers=2", "--num-heads=2", "--embed-dim=64", "--seq-len=32",
        "--max-steps=12", "--log-interval=1", "--learning-rate=0.003", "--warmup-steps=0",
        "--precision=fp32", "--profile-steps=2"]


def run(tmp: Path, name: str, gpus: int, *flags: str) -> list[float]:
    """Per-step losses of a `rustyflow train` run on `gpus` GPUs."""
    model = tmp / f"{name}.npz"
    cmd = [sys.executable, "-m", "rustyflow_py", "train", "--device=gpu", *TINY,
           f"--log-file={tmp / 'log.txt'}", f"--model-path={model}", *flags]
    status = subprocess.run(cmd).returncode if gpus == 1 else launch(cmd, gpus, print)
    assert status == 0
    return Checkpoint(str(model)).meta["train"]["losses"]  # a typed path is used as typed


def close(a: list[float], b: list[float], rel: float = 1e-4) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(y)
                                    for x, y in zip(a, b, strict=True))


@one_gpu
def test_accumulation_matches_the_big_batch_on_one_gpu(tmp_path: Path) -> None:
    big = run(tmp_path, "big", 1, "--batch-size=8")
    accum = run(tmp_path, "accum", 1, "--batch-size=4", "--grad-accum-steps=2")
    assert close(accum, big), (accum, big)


@two_gpus
def test_two_gpus_match_one_gpu_with_twice_the_batch(tmp_path: Path) -> None:
    one = run(tmp_path, "one", 1, "--batch-size=8")
    two = run(tmp_path, "two", 2, "--batch-size=4")
    two_small_buckets = run(tmp_path, "buckets", 2, "--batch-size=4", "--bucket-mb=0.05")
    zero = run(tmp_path, "zero", 2, "--batch-size=4", "--shard-optimizer")
    zero_accum = run(tmp_path, "zacc", 2, "--batch-size=2", "--grad-accum-steps=2",
                     "--shard-optimizer")
    for curve in (two, two_small_buckets, zero, zero_accum):
        assert close(curve, one), (curve, one)
    log = (tmp_path / "log.txt").read_text()
    assert "Communication time" in log  # the profiled steps timed the collectives


@two_gpus
def test_a_sharded_checkpoint_resumes_on_one_gpu(tmp_path: Path) -> None:
    straight = run(tmp_path, "straight", 1, "--batch-size=8")
    model = tmp_path / "half.npz"
    cmd = [sys.executable, "-m", "rustyflow_py", "train", "--device=gpu", *TINY,
           "--max-steps=6", "--batch-size=4", "--shard-optimizer",
           f"--log-file={tmp_path / 'log.txt'}", f"--model-path={model}"]
    assert launch(cmd, 2, print) == 0
    resumed = run(tmp_path, "half", 1, "--batch-size=8", f"--resume={model}")
    assert close(resumed, straight), (resumed, straight)


@two_gpus
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_a_dead_or_stopped_rank_ends_the_gpu_job_naming_it(tmp_path: Path, signum: int) -> None:
    """Rank 1 SIGKILLed (mpiexec ends the job) or SIGSTOPped (rank 0's heartbeat, its main
    thread blocked in NCCL, ends it within COMM_TIMEOUT): a non-zero exit, a line naming
    rank 1, and no process left."""
    mark = uuid.uuid4().hex
    out = tmp_path / "out.txt"
    cmd = [sys.executable, "-m", "rustyflow_py", "train", "--device=gpu", *TINY,
           "--max-steps=0", "--num-epochs=1000", "--comm-timeout=10", "--gpus=2",
           f"--log-file={tmp_path / 'log.txt'}", f"--model-path={tmp_path / 'm.npz'}"]
    with open(out, "w") as stream:
        proc = subprocess.Popen(cmd, stdout=stream, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, MARK: mark})
    try:
        wait_until(lambda: "  step 2 (" in out.read_text() or proc.poll() is not None,
                   "step 2", 120)
        status, output, _ = signal_rank_1(proc, mark, signum, out, 40)
        assert status != 0, output
        want = ("Error: rank 1 was killed by SIGKILL" if signum == signal.SIGKILL
                else "Error: rank 1 has been silent for")
        assert want in output, output
        wait_until(lambda: not marked_pids(mark), "every rank to be gone", 15)
    finally:
        proc.kill()
        proc.wait()
        kill_marked(mark)


@two_gpus
def test_the_replayed_two_gpu_step_is_profiled_on_every_rank(tmp_path: Path) -> None:
    """The graph profile of a 2-GPU run: every rank samples the replays, NCCL's kernels are
    attributed to their buckets' ops, and on each rank the ops' sum is its device-busy time
    plus exactly the time its two streams overlapped (communication less exposed)."""
    run(tmp_path, "graph", 2, "--batch-size=4", "--bucket-mb=0.05", "--profile-mode=graph")
    [record] = read_log(tmp_path / "log.txt")
    assert record["profile"]["timing"] == "cupti-graph", record["profile"].get("note")
    across = record["profile"]["ranks"]
    assert across["count"] == 2
    buckets = [op for op in across["ops"] if op["name"].startswith("all_reduce[")]
    assert len(buckets) == record["parallel"]["buckets"] >= 2
    assert all(op["ranks"] == 2 and op["min_s"] > 0 for op in buckets)
    for busy, total, comm, exposed in zip(across["busy_s"], across["ops_sum_s"],
                                          across["comm_s"], across["exposed_s"], strict=True):
        assert 0 < exposed <= comm
        assert total - busy == pytest.approx(comm - exposed, abs=0.02 * busy)


@two_gpus
def test_zero1_in_bf16_gathers_the_compute_copy_and_saves_whole_weights(tmp_path: Path) -> None:
    """ZeRO-1 in bf16 with the bf16 wire: the steps all-gather only the bf16 compute copy,
    and the float32 master is gathered at each validation and save. Its losses, its
    checkpoint and its best checkpoint are plain data parallel's within bf16's bound (a
    master left unsynced would hold the other rank's half as it was at step 0), and its
    replayed step's profile names both collectives on both ranks."""
    flags = ("--batch-size=4", "--precision=bf16", "--grad-reduce-dtype=bf16",
             "--eval-interval=6", "--profile-mode=graph")
    plain = run(tmp_path, "plain", 2, *flags)
    zero = run(tmp_path, "zero", 2, *flags, "--shard-optimizer")
    assert close(zero, plain, rel=2e-2), (zero, plain)
    for suffix in ("", "-best"):
        want = Checkpoint(str(tmp_path / f"plain{suffix}.npz")).weights
        got = Checkpoint(str(tmp_path / f"zero{suffix}.npz")).weights
        for name, w in want.items():
            gap = float(np.linalg.norm(got[name] - w) / max(np.linalg.norm(w), 1e-12))
            assert gap <= 1e-2, (suffix, name, gap)
    [_, record] = read_log(tmp_path / "log.txt")
    assert record["parallel"]["shard_optimizer"] is True
    assert record["profile"]["timing"] == "cupti-graph", record["profile"].get("note")
    ops = {op["name"]: op for op in record["profile"]["ranks"]["ops"]}
    assert ops["all_gather"]["ranks"] == ops["reduce_scatter"]["ranks"] == 2
