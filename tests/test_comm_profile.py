"""The data-parallel step measured: compute against communication from kernel records on two
streams, rank 0's sampling decision shared by every rank, the ranks' tables side by side, and
tokens/s that agrees with the epoch time (one process, and two MPI ranks on the CPU)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from helpers import TINY_TEXT, make_cfg

from rustyflow_py.engine.comm_overlap import CommAccount, is_comm, merged, uncovered_ns
from rustyflow_py.engine.graph import GraphCaptureError
from rustyflow_py.engine.kernel_records import KernelAttribution, KernelRecord
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.profiler import Profiler
from rustyflow_py.errors import TrainingError
from rustyflow_py.reporting.comm_text import comm_lines, rank_lines
from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.reporting.run_text import format_summary
from rustyflow_py.training.config.config import KEYS
from rustyflow_py.training.run import clock as clock_module
from rustyflow_py.training.run import graph_profile
from rustyflow_py.training.run import step as step_module
from rustyflow_py.training.run.clock import RunClock
from rustyflow_py.training.run.graph_profile import AGREE_EVERY, GraphSampler
from rustyflow_py.training.run.loop import Trainer
from rustyflow_py.training.run.rank_tables import spread, throughput
from rustyflow_py.training.run.step import StepRunner

REPO = Path(__file__).resolve().parents[1]
MAIN, SIDE = 7, 13  # the step's stream and the collectives' stream
FWD = ("linear.matmul", "forward", "matmul")
BWD = ("linear.matmul", "backward", "matmul")
OPT = ("adamw", "optimizer", "other")
B0, B1 = ("all_reduce[0]", "backward", "comm"), ("all_reduce[1]", "backward", "comm")
LOSS = ("all_reduce_loss", "optimizer", "comm")


def kernel(name: str, start: int, end: int, stream: int = MAIN) -> KernelRecord:
    return KernelRecord(name, start, end, 0, stream)


def overlapped_step() -> list[tuple[Any, KernelRecord]]:
    """One replay, in ns: forward 0-100, backward 100-300 (two kernels), bucket 0's all-reduce
    on the side stream 150-250 (under backward), bucket 1's 280-340 (40 ns past backward), the
    loss's all-reduce 340-350 on the step's stream (alone), the optimizer 350-400."""
    return [
        (FWD, kernel("gemm_f", 0, 100)),
        (BWD, kernel("gemm_b1", 100, 200)),
        (BWD, kernel("gemm_b2", 200, 300)),
        (B0, kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 150, 250, SIDE)),
        (B1, kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 280, 340, SIDE)),
        (LOSS, kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 340, 350)),
        (OPT, kernel("adamw", 350, 400)),
    ]


def test_exposed_communication_is_the_time_only_collectives_run() -> None:
    account = CommAccount()
    account.add(overlapped_step())
    account.add([(op, r._replace(start_ns=r.start_ns + 1000, end_ns=r.end_ns + 1000))
                 for op, r in overlapped_step()])  # a second replay, later
    s = account.summary()
    assert s is not None and s["replays"] == 2
    # per replay: compute 0-300 and 350-400 = 350 ns; communication 150-250 and 280-350 = 170;
    # exposed: 300-350 = 50 (bucket 1's last 40 ns and the loss's 10)
    assert s["compute_s"] == pytest.approx(2 * 350e-9)
    assert s["comm_s"] == pytest.approx(2 * 170e-9)
    assert s["exposed_s"] == pytest.approx(2 * 50e-9)
    assert s["overlap_pct"] == pytest.approx(100.0 * 120 / 170)
    ops = {op["name"]: op for op in s["ops"]}
    assert [op["name"] for op in s["ops"]] == ["all_reduce[0]", "all_reduce[1]",
                                               "all_reduce_loss"]  # longest first
    assert ops["all_reduce[0]"]["exposed_s"] == 0.0
    assert ops["all_reduce[1]"]["exposed_s"] == pytest.approx(2 * 40e-9)
    assert ops["all_reduce_loss"]["exposed_s"] == pytest.approx(2 * 10e-9)
    assert ops["all_reduce[0]"]["side_stream"] and ops["all_reduce[1]"]["side_stream"]
    assert not ops["all_reduce_loss"]["side_stream"]


def test_zero1_collectives_on_the_steps_stream_are_wholly_exposed() -> None:
    account = CommAccount()
    account.add([(BWD, kernel("gemm_b", 0, 100)),
                 (("reduce_scatter", "backward", "comm"), kernel("ncclDevKernel_ReduceScatter",
                                                                 100, 160)),
                 (OPT, kernel("adamw", 160, 200)),
                 (("all_gather", "optimizer", "comm"), kernel("ncclDevKernel_AllGather",
                                                              200, 230))])
    s = account.summary()
    assert s is not None
    assert (s["comm_s"], s["exposed_s"], s["overlap_pct"]) == pytest.approx((90e-9, 90e-9, 0.0))
    assert {op["name"]: op["exposed_s"] for op in s["ops"]} == pytest.approx(
        {"reduce_scatter": 60e-9, "all_gather": 30e-9})


def test_one_process_has_no_communication_and_an_nccl_kernel_is_communication_anyway() -> None:
    account = CommAccount()
    account.add([(FWD, kernel("gemm_f", 0, 100)), (OPT, kernel("adamw", 100, 150))])
    assert account.summary() is None
    assert is_comm(BWD, "ncclDevKernel_AllReduce_Sum_f32_RING_LL")  # a mis-tagged node
    assert is_comm(B0, "[memset]") and not is_comm(BWD, "gemm_b")


def test_uncovered_time_matches_counting_nanosecond_by_nanosecond() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        def spans(n: int) -> list[tuple[int, int]]:
            starts = rng.integers(0, 200, n)
            return [(int(a), int(a + rng.integers(0, 40))) for a in starts]
        comm, compute = spans(int(rng.integers(0, 6))), spans(int(rng.integers(0, 6)))
        cover = merged(compute)
        covered = np.zeros(260, bool)
        for a, b in compute:
            covered[a:b] = True
        busy = np.zeros(260, bool)
        for a, b in comm:
            busy[a:b] = True
        assert uncovered_ns(comm, cover) == int((busy & ~covered).sum()), (comm, compute)


def test_sampled_replays_feed_the_communication_split() -> None:
    """The sampler splits each sampled replay by the ops its nodes were tagged with."""

    class Tracer:
        node_ops = {1: BWD, 2: B0}
        read_s = 0.0

        def records(self, run: Any, synchronize: Any) -> list[KernelRecord]:
            run()
            return [KernelRecord("gemm_b", 0, 100, 1, MAIN),
                    KernelRecord("ncclDevKernel_AllReduce", 50, 130, 2, SIDE)]

    prof = Profiler(get_backend("cpu"))
    sampler = GraphSampler(prof, Tracer(), 5, budget=None)  # type: ignore[arg-type]
    prof.graph = KernelAttribution(Tracer.node_ops)
    sampler.sample(lambda: None, lambda: None, step=3)
    comm = sampler.summary()["comm"]
    assert (comm["compute_s"], comm["comm_s"], comm["exposed_s"]) == pytest.approx(
        (100e-9, 80e-9, 30e-9))
    assert comm["ops"][0]["name"] == "all_reduce[0]" and comm["ops"][0]["side_stream"]


def test_every_rank_samples_the_replays_rank_0_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision is shared every AGREE_EVERY replays and at the last one, and it is rank
    0's: a rank that wants a sample in between waits, one that does not follows."""
    monkeypatch.setattr(graph_profile.time, "perf_counter", lambda: 0.0)
    asked: list[bool] = []

    def rank0_says(answer: bool) -> Any:
        def agree(want: bool) -> bool:
            asked.append(want)
            return answer
        return agree

    prof = Profiler(get_backend("cpu"))
    follower = GraphSampler(prof, None, 5, budget=None,  # type: ignore[arg-type]
                            busy=lambda: False, agree=rank0_says(True))
    decisions = [follower.due(last=False) for _ in range(1 + 2 * AGREE_EVERY)]
    # the first replay warms up; then only every AGREE_EVERY-th replay asks, and rank 0 said
    # yes although this rank's device was never busy (it wanted no sample)
    assert [i for i, d in enumerate(decisions) if d] == [AGREE_EVERY, 2 * AGREE_EVERY]
    assert asked == [False, False]
    leader = GraphSampler(prof, None, 5, budget=None, busy=lambda: True,  # type: ignore[arg-type]
                          agree=rank0_says(False))
    assert not any(leader.due(last=False) for _ in range(1 + AGREE_EVERY))
    assert asked[-1] is True  # it wanted one; rank 0 decided otherwise
    assert leader.due(last=True) is False and len(asked) == 4  # the last replay asks too


def figures(rank: int, step_ms: float, compute_ms: float, mm_ms: float) -> dict[str, Any]:
    return {"rank": rank, "steps_time_s": 1.0, "timed_steps": 10, "tokens_per_s": 5000.0,
            "step_s": step_ms / 1e3, "compute_s": compute_ms / 1e3, "exposed_s": 1e-4,
            "busy_s": (step_ms - 0.5) / 1e3, "comm_s": 2e-3,
            "ops": [["linear.matmul", "backward", "matmul", mm_ms / 1e3],
                    ["all_reduce[0]", "backward", "comm", 2e-3]]}


def test_rank_tables_give_min_median_max_and_the_straggler() -> None:
    ranks = [figures(0, 16.0, 12.0, 5.0), figures(1, 16.2, 12.1, 5.2),
             figures(2, 17.6, 13.5, 6.0), figures(3, 16.1, 12.0, 5.1)]
    out = spread(ranks)
    assert out is not None and out["count"] == 4
    mm = out["ops"][0]
    assert (mm["name"], mm["ranks"]) == ("linear.matmul", 4)
    assert (mm["min_s"], mm["median_s"], mm["max_s"]) == pytest.approx((5e-3, 5.15e-3, 6e-3))
    st = out["straggler"]
    assert st["rank"] == 2 and st["step_s"] == pytest.approx(17.6e-3)
    assert st["median_step_s"] == pytest.approx(16.15e-3)
    assert st["median_compute_s"] == pytest.approx(12.05e-3)
    assert out["busy_s"] == pytest.approx([15.5e-3, 15.7e-3, 17.1e-3, 15.6e-3])
    assert out["ops_sum_s"] == pytest.approx([7e-3, 7.2e-3, 8e-3, 7.1e-3])  # each rank's own
    assert out["comm_s"] == pytest.approx([2e-3] * 4)
    assert [r["rank"] for r in throughput(ranks)] == [0, 1, 2, 3]
    assert spread(ranks[:1]) is None  # one rank profiled: nothing to compare

    lines = rank_lines({"ranks": out})
    assert lines[0] == "Top 2 ops over 4 ranks (ms/step):"
    assert lines[-1] == ("Straggler: rank 2's step 17.600 ms against the median 16.150 ms "
                         "(+9.0%); its compute 13.500 ms against the median 12.050 ms")


def test_the_communication_lines_read_per_step() -> None:
    account = CommAccount()
    account.add(overlapped_step())
    lines = comm_lines({"sampling": {"comm": account.summary()}})
    assert lines[0] == (
        "Communication in the replayed step (kernel records of both streams, mean of 1 sampled "
        "replays): compute 0.000 ms, communication 0.000 ms, exposed communication 0.000 ms "
        "(only collectives running), overlap 70.6% of the communication hidden behind compute")
    assert lines[1].split() == ["Collective", "Phase", "ms/step", "Exposed", "ms/step", "Stream"]
    assert lines[3].split()[0] == "all_reduce[0]" and lines[3].split()[-1] == "second"
    assert lines[-1].split()[-1] == "step's"
    assert comm_lines({"sampling": {}}) == [] and rank_lines({}) == []
    ops = [{"name": "linear.matmul", "phase": "forward", "category": "matmul", "time_s": 100e-9},
           {"name": "linear.matmul", "phase": "backward", "category": "matmul",
            "time_s": 200e-9},
           {"name": "adamw", "phase": "optimizer", "category": "other", "time_s": 50e-9},
           {"name": "all_reduce[0]", "phase": "backward", "category": "comm", "time_s": 1e-7}]
    check = comm_lines({"sampling": {"comm": account.summary()}, "ops": ops})[1]
    assert check.startswith("Check: the other ops' times sum to 0.000 ms/step against the "
                            "compute time, +0.00% of it")


def test_the_graph_profile_is_made_only_where_every_rank_can_make_it() -> None:
    warnings: list[str] = []
    tracer: Any = object()
    graph = ("graph", tracer, None)
    assert graph_profile.shared_mode(graph, lambda mine: mine, warnings.append) == graph
    assert graph_profile.shared_mode(graph, lambda mine: False, warnings.append) == (
        "eager", None, "CUPTI is unavailable on another rank of this run")
    asked: list[bool] = []
    eager = ("eager", None, "CUPTI is unavailable: not installed")
    assert graph_profile.shared_mode(eager, lambda mine: asked.append(mine) or False,
                                     warnings.append) == eager
    assert asked == [False]  # a collective: every rank takes part, with or without CUPTI
    assert warnings == ["WARN: per-op profile from an eager window instead of the replayed "
                        "graph: CUPTI is unavailable on another rank of this run"]


class FakeRunner:
    def __init__(self) -> None:
        self.startup = {"first_step_s": 0.0, "capture_s": 0.0}
        self.phases = {"eval": 0.0, "checkpoint": 0.0}


def test_tokens_per_s_is_the_epoch_clocks_and_ignores_what_runs_after_the_epoch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An epoch of 10 steps in 2 s, of which the start-up (2 steps) took 0.5 s and a
    validation 0.3 s; then 4 s of untimed work after the epoch (the wait for the other ranks
    at the stop agreement, say): tokens/s stays tokens per epoch / epoch time."""
    now = [0.0]
    monkeypatch.setattr(clock_module.time, "perf_counter", lambda: now[0])
    runner = FakeRunner()
    clock = RunClock(runner, lambda: None, 0)
    clock.start_run()
    clock.start_epoch(0)
    runner.startup.update(first_step_s=0.4, capture_s=0.1)
    runner.phases["eval"] = 0.3
    now[0] = 2.0
    assert clock.tokens_per_s(10, 100) == pytest.approx(8 * 100 / 1.2)  # the live line
    epoch = clock.epoch_time(10)
    assert epoch == pytest.approx(1.2 * 10 / 8)  # the start-up steps at the epoch's pace
    now[0] = 6.0
    clock.end_run(10)
    seconds, counted = clock.trained
    assert (seconds, counted) == (pytest.approx(1.2), 8)
    assert 10 * 100 / epoch == pytest.approx(counted * 100 / seconds)


def test_a_resumed_epoch_counts_only_this_processs_time(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [10.0]
    monkeypatch.setattr(clock_module.time, "perf_counter", lambda: now[0])
    clock = RunClock(FakeRunner(), lambda: None, 30)
    clock.start_epoch(30, elapsed=7.0)  # 7 s of this epoch ran in the process before
    now[0] = 12.0
    assert clock.training(40) == (pytest.approx(2.0), 10)
    assert clock.tokens_per_s(10, 50) == pytest.approx(10 * 50 / 2.0)


def assert_honest_throughput(r: dict[str, Any]) -> None:
    """The record's tokens/s is its counted steps' tokens over its training time, and agrees
    with its epoch time within 2%."""
    tokens_per_step = r["model"]["batch"] * r["model"]["seq_len"] * r["parallel"][
        "world_size"] * r["parallel"]["grad_accum_steps"]
    assert r["tokens_per_s"] == pytest.approx(
        r["timed_steps"] * tokens_per_step / r["steps_time_s"], rel=1e-9)
    assert r["epochs"] >= 1
    # each epoch's own time, unrounded, of which the average is the one reported
    assert len(r["epoch_times_s"]) == r["epochs"]
    assert sum(r["epoch_times_s"]) / r["epochs"] == pytest.approx(r["avg_epoch_time_s"])
    per_epoch = r["steps_per_epoch"] * tokens_per_step
    assert per_epoch / r["avg_epoch_time_s"] == pytest.approx(r["tokens_per_s"], rel=0.02)
    assert r["steps_time_s"] < r["train_time_s"] - r["eval_time_s"]


def test_one_process_tokens_per_s_agrees_with_its_epoch_time(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.txt").write_text(TINY_TEXT)
    record = Trainer(make_cfg(NUM_EPOCHS=2, PROFILE=True), lambda _: None).run()
    assert record is not None and record["status"] == "completed"
    assert_honest_throughput(record)
    assert "ranks" not in record["parallel"] and "ranks" not in record["profile"]


try:
    import mpi4py  # noqa: F401

    from rustyflow_py.distributed.launcher import find_mpiexec

    MPIEXEC: str | None = find_mpiexec()
except Exception:  # no mpi extra: the MPI test skips
    MPIEXEC = None


@pytest.mark.skipif(MPIEXEC is None, reason="needs MPI: pip install -e '.[mpi]'")
def test_two_cpu_ranks_gather_their_tables_and_report_honest_throughput(tmp_path: Path) -> None:
    """Two ranks train a profiled epoch: rank 0's record has both ranks' throughput and each
    op as min / median / max over the ranks, and its tokens/s agrees with its epoch time."""
    (tmp_path / "tiny.txt").write_text(TINY_TEXT)
    (tmp_path / "dp.env").write_text(
        "DATASET=tiny.txt\nSEQ_LEN=16\nBATCH_SIZE=2\nEMBED_DIM=32\nNUM_HEADS=2\nNUM_LAYERS=1\n"
        "LEARNING_RATE=1e-2\nWARMUP_STEPS=2\nLOG_INTERVAL=4\nDEVICE=cpu\nTHREADS=1\n"
        "NUM_EPOCHS=1\nPROFILE=true\nBUCKET_MB=0.01\nLOG_FILE=log.txt\nMODEL_PATH=dp.npz\n")
    env = {k: v for k, v in os.environ.items() if k not in KEYS
           and not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_", "HYDRA_"))}
    env.update(PYTHONPATH=str(REPO), RUSTYFLOW_DISABLE_GPU="1")
    assert MPIEXEC is not None
    result = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "rustyflow_py", "train",
                             "--config", "dp.env"], cwd=tmp_path, env=env, text=True,
                            capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    [r] = read_log(tmp_path / "log.txt")
    assert r["parallel"]["world_size"] == 2
    assert_honest_throughput(r)
    ranks = r["parallel"]["ranks"]
    assert [x["rank"] for x in ranks] == [0, 1]
    assert all(x["timed_steps"] == r["timed_steps"] and x["tokens_per_s"] > 0 for x in ranks)
    across = r["profile"]["ranks"]
    assert across["count"] == 2 and len(across["step_s"]) == 2
    names = {op["name"] for op in across["ops"]}
    assert {"all_reduce[0]", "all_reduce[1]", "all_reduce_loss"} <= names
    for op in across["ops"]:
        assert op["min_s"] <= op["median_s"] <= op["max_s"] and op["ranks"] == 2
    assert across["straggler"]["rank"] in (0, 1)
    summary = format_summary(r, "log.txt")
    assert "Straggler: rank " in summary
    assert "Top 5 ops over 2 ranks (ms/step):" in (tmp_path / "log.txt").read_text()


def test_a_rank_cannot_drop_its_graph_or_profile_alone_when_the_ranks_sample_together() -> None:
    """A capture or CUPTI failure on one rank of a data-parallel run whose ranks agree on the
    sampled replays fails the run, naming the setting that avoids it (going on alone would
    leave the other ranks waiting in the agreement for ever); alone, or without agreement,
    the rank goes on as before."""
    agreeing = SimpleNamespace(sampler=SimpleNamespace(agree=lambda want: want))
    with pytest.raises(TrainingError, match=r"capture failed \(boom\).*set GRAPH=off"):
        StepRunner._alone_fails(agreeing, "capture failed (boom)", "GRAPH=off")
    for alone in (SimpleNamespace(sampler=None),
                  SimpleNamespace(sampler=SimpleNamespace(agree=None))):
        StepRunner._alone_fails(alone, "capture failed (boom)", "GRAPH=off")  # no error


class FakeCapture:
    """CapturedStep's part that `_capture` calls, failing on capture when `fails`."""

    fails = False

    def __init__(self, backend: Any, body: Any) -> None:
        self.replays = 0

    def capture(self) -> None:
        if self.fails:
            raise GraphCaptureError("boom")

    def replay(self) -> None:
        self.replays += 1


@pytest.mark.parametrize("fails", [False, True])
def test_every_rank_ends_its_start_up_at_a_barrier_counted_as_start_up(
        monkeypatch: pytest.MonkeyPatch, fails: bool) -> None:
    """The wait for the slowest rank's capture is start-up on every rank, not the first
    replay's training time; a rank whose capture failed comes to the same barrier (else the
    others would wait there for ever) before it trains eagerly."""
    now = [0.0]
    events: list[str] = []

    def barrier() -> None:
        events.append("barrier")
        now[0] += 5.0  # the slowest rank arrives 5 s later

    monkeypatch.setattr(step_module.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(step_module, "CapturedStep",
                        type("Capture", (FakeCapture,), {"fails": fails}))
    runner = object.__new__(StepRunner)
    runner.backend = SimpleNamespace(tracking_memory=contextlib.nullcontext,
                                     release_cached_memory=lambda: None)
    runner.sampler, runner.graph, runner.captured = None, True, None
    runner.startup = {"first_step_s": 0.0, "capture_s": 0.0, "cache": None}
    runner.shards = SimpleNamespace(comm=SimpleNamespace(barrier=barrier))
    runner.warn = events.append
    runner._body = lambda timed: events.append(f"eager step, timed={timed}")
    runner._capture()
    if fails:
        assert events[1:] == ["barrier", "eager step, timed=True"], events
        assert runner.captured is None and not runner.graph
    else:
        assert events == ["barrier"] and runner.captured.replays == 1
        assert runner.startup["capture_s"] == 5.0
    runner.shards = SimpleNamespace(comm=None)  # one process: nothing to wait for
    events.clear()
    runner.graph, runner.captured = True, None
    runner._capture()
    assert "barrier" not in events
