"""The profile of the step that runs: kernel records attributed to ops, the work each op does,
the sampling schedule, start-up kept out of the epoch time, and the report/trace they make.

The CPU cases run the attribution, aggregation and rendering on synthetic kernel records and on
a real H100 run's committed log; the GPU cases run CUPTI on the seed-like tiny model.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import TINY, quiet
from test_trace import check_nesting, check_schema, tracks

from rustyflow_py.engine.autograd import RowGrad, run_op
from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.kernel_records import (
    UNATTRIBUTED,
    KernelAttribution,
    KernelRecord,
    busy_ns,
    last_replay,
    short_kernel_name,
)
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.op_cost import gemm_cost, op_bytes
from rustyflow_py.engine.peaks import compute_type, lookup, probe_gpu
from rustyflow_py.engine.profiler import Profiler
from rustyflow_py.errors import ConfigError
from rustyflow_py.reporting import profile_text
from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.reporting.log_writer import format_block
from rustyflow_py.reporting.trace import graph_trace
from rustyflow_py.training.config.config import load_config
from rustyflow_py.training.run import clock as clock_module
from rustyflow_py.training.run import graph_profile
from rustyflow_py.training.run.graph_profile import GraphSampler, choose_mode
from rustyflow_py.training.run.loop import Trainer

pytestmark = pytest.mark.usefixtures("tiny_dir")

GRAPH_LOG = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "runs"
             / "h100-seed-graph-profile.log")
FWD = ("linear", "forward", "other")
MM = ("linear.matmul", "forward", "matmul")
BWD = ("linear.matmul", "backward", "matmul")


def rec(name: str, start: int, end: int, node: int) -> KernelRecord:
    return KernelRecord(name, start, end, node)


def two_replays() -> list[list[KernelRecord]]:
    """Two replays of a 4-node graph; node 9 was never tagged; the second replay has a gap."""
    first = [rec("gemm_a", 0, 100, 1), rec("bias", 100, 120, 2), rec("gemm_b", 120, 300, 3),
             rec("stray", 300, 310, 9)]
    second = [rec("gemm_a", 1000, 1100, 1), rec("bias", 1150, 1170, 2),
              rec("gemm_b", 1170, 1350, 3), rec("stray", 1350, 1360, 9)]
    return [first, second]


def test_kernels_are_attributed_to_the_op_that_made_their_node() -> None:
    attribution = KernelAttribution({1: MM, 2: FWD, 3: BWD})
    for replay in two_replays():
        attribution.add_replay(replay)
    times = attribution.op_times()
    assert times == {MM: 200e-9, FWD: 40e-9, BWD: 360e-9, UNATTRIBUTED: 20e-9}
    assert attribution.kernels(BWD) == [{"name": "gemm_b", "calls_per_step": 1.0,
                                         "time_s": 360e-9}]
    totals = attribution.totals()
    # the per-op sum is every record's time; busy is the union; span adds the 50 ns gap
    assert sum(times.values()) == pytest.approx(totals["kernel_s"])
    assert totals["busy_s"] == pytest.approx(310e-9 + 310e-9)
    assert totals["span_s"] == pytest.approx(310e-9 + 360e-9)
    assert totals["replays"] == 2
    assert [op for op, _ in attribution.first] == [MM, FWD, BWD, UNATTRIBUTED]


def test_busy_time_is_the_union_of_overlapping_records() -> None:
    records = [rec("a", 0, 100, 1), rec("b", 50, 80, 2), rec("c", 90, 150, 3),
               rec("d", 200, 210, 4)]
    assert busy_ns(records) == 150 + 10
    assert busy_ns([]) == 0


def test_the_last_replay_is_the_last_record_of_each_node() -> None:
    """Recording switched on while a replay runs can catch its tail: only the sampled (last)
    replay's records are kept, one per node."""
    tail = [rec("gemm_b", 0, 50, 3), rec("stray", 50, 60, 9)]
    replay = two_replays()[1]
    assert last_replay(tail + replay) == replay


def test_kernel_names_lose_return_type_and_parameters_but_keep_templates() -> None:
    kernel = "cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nn_align1>"
    assert short_kernel_name(f"void {kernel}(Params)") == kernel
    assert short_kernel_name("xent_fwd") == "xent_fwd"
    assert len(short_kernel_name("k" * 200)) == 80


def test_gemm_cost_and_shape() -> None:
    q, kt = np.zeros((2, 3, 16, 8), np.float32), np.zeros((2, 3, 8, 16), np.float32)
    flops, shape, dtypes = gemm_cost(q, q @ kt)
    assert (flops, shape, dtypes) == (2.0 * 2 * 3 * 16 * 16 * 8, (6, 16, 16, 8),
                                      "float32->float32")
    x, w = np.zeros((5, 7), np.float32), np.zeros((7, 11), np.float32)
    # a fused Linear returns (y, state): the product is its first array
    assert gemm_cost(x, (x @ w, None))[:2] == (2.0 * 5 * 11 * 7, (1, 5, 11, 7))
    assert gemm_cost(x, None) is None
    assert op_bytes((x, w), x @ w) == x.nbytes + w.nbytes + 5 * 11 * 4
    assert op_bytes((x, x), x) == x.nbytes  # one array counted once


def test_an_op_counts_the_arrays_its_caller_says_it_read_and_no_others() -> None:
    """A backward reads its Function's saved arrays and a row gradient its rows and indices
    (a __slots__ class): run_op's `saved` names them. An op that is a bound method of some
    other object (the gradient's wire copy, say) does not count that object's arrays."""
    backend = get_backend("cpu")
    dst = np.zeros((10, 4), np.float32)
    g = RowGrad(np.array([1, 3, 1]), np.ones((3, 4), np.float32), dst.shape, backend.kernels)

    class Holder:
        def __init__(self) -> None:
            self.big = np.zeros(1000, np.float32)

        def touch(self, a: np.ndarray) -> None:
            a += 1

    prof = Profiler(backend)
    with prof:
        run_op("grad_accumulate", "other", "backward", g.add_to, dst, saved=g)
        run_op("touch", "other", "backward", Holder().touch, dst)
    bytes_of = {row["name"]: row["bytes"] for row in prof.ops()}
    assert bytes_of["grad_accumulate"] == dst.nbytes + g.idx.nbytes + g.rows.nbytes
    assert bytes_of["touch"] == dst.nbytes
    assert dst[1, 0] == 3 and dst[3, 0] == 2  # the ops ran


def test_the_profiler_counts_every_gemm_flop_of_a_step() -> None:
    """The FLOPs the profiler counts at the op boundary add up to the model's own count."""
    trainer = Trainer(tiny_cfg(), quiet)
    trainer.runner.run(0)
    m, cfg = trainer.model, trainer.cfg
    counted = sum(row["flops"] for row in trainer.profiler.ops() if row["category"] == "matmul")
    assert counted == pytest.approx(m.matmul_flops_per_step(cfg.batch_size, cfg.seq_len))
    gemms = [row for row in trainer.profiler.ops() if row.get("gemms")]
    assert all(g["dtypes"] == "float32->float32" for row in gemms for g in row["gemms"])


def test_tagging_mode_names_the_running_op_and_counts_calls_without_timing() -> None:
    prof = Profiler(get_backend("cpu"))
    seen = []
    prof.tagging = True
    with prof:
        run_op("outer", "other", "forward",
               lambda: run_op("inner", "matmul", "forward", lambda: seen.append(prof.current())))
    assert seen == [("inner", "forward", "matmul")]
    assert prof.current() is None
    assert {k: v[0] for k, v in prof.stats.items()} == {("outer", "forward", "other"): 1,
                                                        ("inner", "forward", "matmul"): 1}
    assert all(v[1] == 0.0 for v in prof.stats.values())


class FakeTracer:
    """CuptiTracer's interface over synthetic records (no CUDA)."""

    node_ops = {1: MM, 2: FWD, 3: BWD}
    read_s = 0.004  # as if reading each sample's records took 4 ms

    def __init__(self) -> None:
        self.replays = iter(two_replays() * 10)

    def records(self, run: Any, synchronize: Any) -> list[KernelRecord]:
        run()
        synchronize()
        return next(self.replays)


def sampler_with_graph(max_samples: int, budget: float | None) -> GraphSampler:
    prof = Profiler(get_backend("cpu"))
    sampler = GraphSampler(prof, FakeTracer(), max_samples, budget=budget)  # type: ignore[arg-type]
    prof.graph = KernelAttribution(FakeTracer.node_ops)
    return sampler


def test_sampling_skips_the_first_replay_and_stops_at_the_cap() -> None:
    sampler = sampler_with_graph(max_samples=2, budget=None)
    decisions = []
    for _ in range(1 + 3 * graph_profile.STREAK):
        due = sampler.due(last=False)
        decisions.append(due)
        if due:
            sampler.sample(lambda: None, lambda: None, step=7)
    wait = [False] * (graph_profile.STREAK - 1)
    assert decisions == [False, *wait, True, *wait, True, *wait, False]
    assert sampler.profiler.graph.replays == 2 and sampler.profiler.steps == 2
    assert sampler.profiler.graph.first_step == 7
    summary = sampler.summary()
    assert summary["samples"] == 2 and summary["nodes_tagged"] == 3
    assert summary["cost_s"] == pytest.approx(sum(summary["sample_costs_s"]), abs=1e-5)
    assert summary["cost_s"] >= 2 * FakeTracer.read_s  # reading the records is the cost


def test_a_replay_is_sampled_only_in_a_run_of_busy_launches() -> None:
    """Right after the host waited for the device (a loss read-back) the next replays would
    start cold: the sample waits until STREAK launches in a row found the device busy,
    except a short run's last step."""
    running = [False]
    sampler = sampler_with_graph(max_samples=5, budget=None)
    sampler.busy = lambda: running[0]
    assert not sampler.due(last=False)  # the first replay
    assert not sampler.due(last=False)  # the device is idle
    assert sampler.due(last=True)  # no sample yet and the run ends: take this one
    running[0] = True
    decisions = [sampler.due(last=False) for _ in range(graph_profile.STREAK)]
    assert decisions == [False] * (graph_profile.STREAK - 1) + [True]
    sampler.sample(lambda: None, lambda: None)
    assert not sampler.due(last=False)  # the streak starts again after a sample


def test_sampling_keeps_within_its_budget_and_samples_a_short_runs_last_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(graph_profile.time, "perf_counter", lambda: clock[0])
    sampler = sampler_with_graph(max_samples=10, budget=0.01)
    assert not sampler.due(last=False)  # the first replay, at t=100
    sampler._last_cost = 0.01  # as the capture estimates it from the graph's nodes
    clock[0] = 100.5  # 1% of 0.5 s is 5 ms: no room for a 10 ms sample yet
    assert not sampler.due(last=False)
    assert sampler.due(last=True)  # a run ending now gets its one sample all the same
    clock[0] = 101.0
    assert [sampler.due(last=False) for _ in range(graph_profile.STREAK)][-1]
    sampler._streak = 0
    sampler._last_cost = sampler.cost_s = 0.02  # as if a sample had cost 20 ms
    clock[0] = 103.0  # 1% of 3 s is 30 ms: not yet room for another 20 ms
    assert not any(sampler.due(last=False) for _ in range(graph_profile.STREAK))
    clock[0] = 105.0
    assert [sampler.due(last=False) for _ in range(graph_profile.STREAK)][-1]


def test_profile_mode_choice_and_its_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    warnings: list[str] = []
    assert choose_mode("auto", "cpu", False, warnings.append) == ("wall", None, None)
    assert choose_mode("eager", "gpu", True, warnings.append) == ("eager", None, None)
    assert choose_mode("auto", "gpu", False, warnings.append) == ("eager", None, None)
    assert warnings == []
    assert choose_mode("graph", "gpu", False, warnings.append) == ("eager", None, None)
    assert "GRAPH=off" in warnings.pop()

    def busy() -> None:
        raise graph_profile.CuptiUnavailable("CUPTI is in use by another tool")

    monkeypatch.setattr(graph_profile, "CuptiTracer", busy)
    assert choose_mode("auto", "gpu", True, warnings.append) == (
        "eager", None, "CUPTI is unavailable: CUPTI is in use by another tool")
    assert warnings == ["WARN: per-op profile from an eager window instead of the replayed "
                        "graph: CUPTI is in use by another tool"]
    monkeypatch.setattr(graph_profile, "CuptiTracer", FakeTracer)
    mode, tracer, why = choose_mode("graph", "gpu", True, warnings.append)
    assert mode == "graph" and isinstance(tracer, FakeTracer) and why is None


@pytest.mark.parametrize("value", ["cupti", "", "GRAPH"])
def test_a_bad_profile_mode_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match="PROFILE_MODE"):
        load_config(None, {"PROFILE_MODE": value}, environ={})


def test_a_cold_start_is_kept_out_of_the_epoch_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """An epoch of 11 steps at 1 s each: warm, 11 s; cold, the first step takes 30 s of which
    29 are kernel compilation. Both report 11 s (the start-up step counted at the epoch's own
    step time), and the start-up has its own line."""
    now = [0.0]
    monkeypatch.setattr(clock_module.time, "perf_counter", lambda: now[0])
    trainer = Trainer(tiny_cfg(), quiet)
    for cold, elapsed in ((False, 11.0), (True, 40.0)):
        now[0] = 0.0
        trainer.parts.clock.start_epoch(step=0)
        trainer.runner.startup["first_step_s"] = 30.0 if cold else 0.0
        now[0] = elapsed
        assert trainer.parts.clock.epoch_time(step=11) == pytest.approx(11.0)
    record = {"startup": {"first_step_s": 30.0, "capture_s": 0.5, "cache": "cold"}}
    assert profile_text.startup_line(record) == [
        "Start-up: first step 30.000s (kernel compilation and GEMM plans; kernel cache cold), "
        "graph capture 0.500s; kept out of the epoch times and tokens/s"]


def test_evaluation_is_out_of_the_estimate_with_the_profile_off() -> None:
    """A run that finished no epoch estimates one from its steps' own time, not from a total
    that includes evaluation, whether or not it was profiled."""
    record = {"steps": 100, "steps_here": 100, "steps_per_epoch": 1000, "train_time_s": 50.0,
              "timed_steps": 100, "steps_time_s": 2.0, "epochs": 0, "profile": None,
              "status": "completed", "epochs_planned": 1}
    text = format_block(record)
    assert "[AVG_EPOCH_TIME] 20.000000" in text
    assert "100 steps in 2.000s (evaluation and start-up excluded) scaled to 1,000" in text


def test_peaks_come_from_the_table_by_name_and_compute_type() -> None:
    h100, h200 = lookup("NVIDIA H100 80GB HBM3"), lookup("NVIDIA H200")
    assert h100 is not None and h100["tflops"]["bf16"] == 989.4
    assert h200 is not None and h200["bandwidth_gbs"] == 4800.0
    assert lookup("NVIDIA GeForce GT 710") is None  # not in the table: measured instead
    assert compute_type("bfloat16", "bf16") == "bf16"
    assert compute_type("float32", "tf32") == "tf32"
    assert compute_type("float32", "bf16") == "fp32"


def graph_record() -> dict[str, Any]:
    records = read_log(GRAPH_LOG)
    assert records, f"{GRAPH_LOG} holds no run"
    return records[-1]


def test_a_real_graph_profile_renders_kernels_roofline_and_its_check() -> None:
    """The committed H100 run: its block names the replays, accounts for every microsecond
    of the replayed step (ops + idle between kernels = 100%), and drills into kernels."""
    r = graph_record()
    prof = r["profile"]
    assert prof["timing"] == "cupti-graph" and prof["sampling"]["replays"] >= 1
    lines = format_block(r).split("\n")
    head = next(line for line in lines if line.startswith("Per-op profile"))
    assert "sampled CUDA-graph replay" in head
    total = next(line for line in lines if line.startswith("all ops"))
    assert math.isclose(float(total.split()[-1]), 100.0, abs_tol=0.15)
    check = next(line for line in lines if line.startswith("Check: per-op times"))
    drift = float(check.split("ms/step, ")[1].split("%")[0])
    assert abs(drift) < 2.0
    assert any(line.startswith("Kernels of the top") for line in lines)
    assert any("GEMM fp32" in line and "TFLOP/s of 67.0 TFLOP/s" in line for line in lines)
    kernels = {op["name"]: op["kernels"] for op in prof["ops"] if op["time_s"] > 0}
    assert all(kernels.values())


def test_the_trace_of_a_graph_profile_nests_ops_over_their_kernels() -> None:
    attribution = KernelAttribution({1: MM, 2: FWD, 3: BWD})
    attribution.add_replay(two_replays()[0], step=12)
    doc = graph_trace(attribution.first, attribution.first_step, device="gpu",
                      hardware="fake", replays=1)
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    ops = [e for e in events if e["tid"] == 1 and e["cat"] not in ("phase", "step")]
    kernels = [e for e in events if e["tid"] == 2]
    assert [e["name"] for e in kernels] == ["gemm_a", "bias", "gemm_b", "stray"]
    assert [e["name"] for e in ops] == ["linear.matmul", "linear", "linear.matmul",
                                        "(unattributed)"]
    step = next(e for e in events if e["cat"] == "step")
    assert step["name"] == "step 12" and step["dur"] == pytest.approx(0.31)
    assert doc["otherData"]["timing"] == "cupti-graph"


def tiny_cfg(device: str = "cpu", **changes: object) -> Any:
    cfg, _ = load_config(None, {**TINY, "PROFILE": True, "DEVICE": device, **changes},
                         environ={})
    return cfg


def _cupti_reason() -> str | None:
    reason = gpu_unavailable_reason()
    if reason is not None:
        return str(reason)
    try:
        import cupti  # noqa: F401
    except ImportError:
        return "cupti-python is not installed"
    return None


needs_cupti = [pytest.mark.gpu,
               pytest.mark.skipif(_cupti_reason() is not None, reason=str(_cupti_reason()))]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@needs_cupti[0]
@needs_cupti[1]
def test_gpu_graph_profile_attributes_every_kernel(precision: str) -> None:
    """On the GPU: every op recorded at capture has kernels, nothing is unattributed, and the
    per-op times sum to the device-busy time of the same replays (within 2%)."""
    trainer = Trainer(tiny_cfg("gpu", PRECISION=precision, PROFILE_MODE="graph",
                               PROFILE_STEPS=4), quiet)
    assert trainer.parts.profile_mode == "graph"
    runner = trainer.runner
    runner.sampler.budget = None
    runner.sampler.busy = lambda: True  # this tiny model's device is idle between launches
    for step in range(3 + 4 * graph_profile.STREAK):  # warm-up, capture, first replay, 4 samples
        runner.run(step)
    prof = trainer.profiler
    assert prof.graph is not None and prof.graph.replays == 4
    rows = {(r["name"], r["phase"], r["category"]): r for r in prof.ops()}
    captured = [key for key in prof.stats if key in rows]
    assert captured and UNATTRIBUTED not in rows, prof.graph.kernels(UNATTRIBUTED)
    # an op that launched nothing itself (a reshape) has no kernels; every other op has some
    with_kernels = [key for key in captured if rows[key]["kernels"]]
    assert {"lm_head_xent.matmul", "adamw", "layernorm", "gather_batch"} <= {
        key[0] for key in with_kernels}, [k for k in prof.graph.kernels(UNATTRIBUTED)]
    totals = prof.graph.totals()
    assert sum(r["time_s"] for r in rows.values()) == pytest.approx(totals["kernel_s"])
    assert abs(totals["kernel_s"] - totals["busy_s"]) <= 0.02 * totals["busy_s"]


@needs_cupti[0]
@needs_cupti[1]
def test_gpu_trace_of_the_graph_profile() -> None:
    """--trace on a graph profile: the sampled replay's ops nest step > phase > op on one
    track, and every kernel is on a second track naming its op."""
    trainer = Trainer(tiny_cfg("gpu", MAX_STEPS=8, PROFILE_MODE="graph"), quiet,
                      trace="t.json")
    trainer.run()
    doc = json.loads(Path("t.json").read_text())
    check_schema(doc)
    assert set(tracks(doc)) == {(2, 1), (2, 2)}
    check_nesting({**doc, "traceEvents": [e for e in doc["traceEvents"] if e["tid"] == 1]})
    kernels = tracks(doc)[(2, 2)]
    assert kernels and all(e["cat"] == "kernel" and e["args"]["op"] for e in kernels)
    assert doc["otherData"]["timing"] == "cupti-graph"


@needs_cupti[0]
@needs_cupti[1]
def test_gpu_cupti_held_by_another_profiler_falls_back_to_the_eager_window() -> None:
    """With another CUPTI tool attached (torch.profiler's Kineto here, as Nsight Systems would
    be), the run says so in one line and profiles an eager window instead. In a process of its
    own: Kineto keeps CUPTI after its profile ends."""
    pytest.importorskip("torch", reason="torch.profiler plays the other CUPTI tool")
    script = """
import sys
from torch.profiler import ProfilerActivity, profile
from rustyflow_py.training.run.graph_profile import choose_mode
warnings = []
with profile(activities=[ProfilerActivity.CUDA]):
    mode, tracer, _ = choose_mode("auto", "gpu", True, warnings.append)
print(mode, tracer is None, len(warnings))
print(warnings[0] if warnings else "")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    first, warning = done.stdout.strip().splitlines()[-2:]
    assert first == "eager True 1"
    assert warning.startswith("WARN: per-op profile from an eager window instead of the "
                              "replayed graph: CUPTI is in use by another tool")


@pytest.mark.gpu
@pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))
def test_gpu_peak_probe_measures_a_gemm_and_a_copy() -> None:
    """A GPU missing from the table gets measured peaks: positive, finite, and named as a
    measured probe (the numbers themselves belong to benchmarks, not to this test)."""
    backend = get_backend("gpu")
    measured = probe_gpu(backend, np.float32, "fp32", n=1024, reps=3)
    assert measured["source"].startswith("measured probe")
    assert list(measured["tflops"]) == ["fp32"] and measured["tflops"]["fp32"] > 0
    assert math.isfinite(measured["bandwidth_gbs"]) and measured["bandwidth_gbs"] > 0
