"""`rustyflow train --trace`: a Chrome/Perfetto trace of the profiled steps whose events are
well formed, nest on every track, and add up to the profiler's own totals."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import TINY, quiet

from rustyflow_py.cli import main
from rustyflow_py.engine.autograd import run_op
from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.profiler import OpSpan, Profiler
from rustyflow_py.reporting.trace import chrome_trace
from rustyflow_py.training.config.config import Config, load_config
from rustyflow_py.training.run import parts as run_parts
from rustyflow_py.training.run.loop import Trainer
from rustyflow_py.training.run.signals import Stopped

pytestmark = pytest.mark.usefixtures("tiny_dir")


def tiny_cfg(device: str = "cpu", **changes: object) -> Config:
    cfg, _ = load_config(None, {**TINY, "PROFILE": True, "DEVICE": device, **changes},
                         environ={})
    return cfg


def timed(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def check_schema(doc: dict[str, Any]) -> None:
    assert set(doc) == {"traceEvents", "displayTimeUnit", "otherData"}
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M")
        assert isinstance(e["name"], str) and isinstance(e["pid"], int)
        assert isinstance(e["tid"], int) and isinstance(e["args"], dict)
        if e["ph"] == "X":
            assert isinstance(e["cat"], str)
            assert isinstance(e["ts"], float | int) and e["ts"] >= 0
            assert isinstance(e["dur"], float | int) and e["dur"] >= 0


def tracks(doc: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    out: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in timed(doc):
        out[(e["pid"], e["tid"])].append(e)
    return out


def parents(events: list[dict[str, Any]]) -> dict[int, dict[str, Any] | None]:
    """Each event's innermost enclosing event on its track (by index); fails on any partial
    overlap, the thing a trace viewer cannot draw."""
    eps = 1e-6  # µs: ts and end are rounded to the nanosecond
    order = sorted(range(len(events)), key=lambda i: (events[i]["ts"], -events[i]["dur"]))
    stack: list[int] = []
    out: dict[int, dict[str, Any] | None] = {}
    for i in order:
        e = events[i]
        while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= e["ts"] + eps:
            stack.pop()
        if stack:
            top = events[stack[-1]]
            assert e["ts"] + e["dur"] <= top["ts"] + top["dur"] + eps, (e, top)
        out[i] = events[stack[-1]] if stack else None
        stack.append(i)
    return out


def check_nesting(doc: dict[str, Any]) -> None:
    """step > phase > op > op on every track, each op inside the phase it belongs to."""
    for events in tracks(doc).values():
        up = parents(events)
        for i, e in enumerate(events):
            parent = up[i]
            if e["cat"] == "step":
                assert parent is None
            elif e["cat"] == "phase":
                assert parent is not None and parent["cat"] == "step"
                assert parent["args"]["step"] == e["args"]["step"]
            else:
                assert parent is not None and parent["cat"] in ("phase", "matmul", "other")
                if parent["cat"] == "phase":
                    assert parent["name"] == e["args"]["phase"]


def self_times(doc: dict[str, Any], pid: int) -> dict[tuple[str, str, str], float]:
    """Seconds per (op, phase, category) on a track, each op less its children (the profiler
    charges a fused op its own time and its matmuls theirs)."""
    events = tracks(doc)[(pid, 1)]
    up = parents(events)
    totals: dict[tuple[str, str, str], float] = defaultdict(float)
    for i, e in enumerate(events):
        if e["cat"] in ("matmul", "other"):
            key = (e["name"], e["args"]["phase"], e["cat"])
            totals[key] += e["dur"] / 1e6
            parent = up[i]
            if parent is not None and parent["cat"] in ("matmul", "other"):
                pkey = (parent["name"], parent["args"]["phase"], parent["cat"])
                totals[pkey] -= e["dur"] / 1e6
    return totals


def test_cpu_trace_schema_nesting_and_sums() -> None:
    trainer = Trainer(tiny_cfg(MAX_STEPS=6), quiet, trace="out/trace.json")
    trainer.run()
    doc = json.loads(Path("out/trace.json").read_text())
    check_schema(doc)
    check_nesting(doc)
    meta = doc["otherData"]
    assert meta["steps_traced"] == meta["steps_profiled"] == 6 and meta["timing"] == "wall"
    assert {e["name"] for e in timed(doc) if e["cat"] == "step"} == {
        f"step {n}" for n in range(1, 7)}
    assert {e["name"] for e in timed(doc) if e["cat"] == "phase"} == {
        "data", "forward", "backward", "optimizer"}
    assert list(tracks(doc)) == [(1, 1)]  # the CPU runs its ops on the main thread
    stats = trainer.profiler.stats
    sums = self_times(doc, 1)
    assert set(sums) == set(stats)
    for key, (calls, seconds) in stats.items():
        assert sums[key] == pytest.approx(seconds, abs=1e-8 * calls), key
    assert [p.name for p in Path("out").iterdir()] == ["trace.json"]  # no temp file left


@pytest.mark.gpu
@pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))
def test_gpu_trace_has_host_and_device_tracks() -> None:
    trainer = Trainer(tiny_cfg("gpu", MAX_STEPS=8, PROFILE_STEPS=3, PROFILE_MODE="eager"),
                      quiet, trace="t.json")
    trainer.run()
    doc = json.loads(Path("t.json").read_text())
    check_schema(doc)
    check_nesting(doc)
    assert set(tracks(doc)) == {(1, 1), (2, 1)}
    assert doc["otherData"]["steps_traced"] == 3 and doc["otherData"]["timing"] == "cuda-events"
    sums = self_times(doc, 2)
    for key, (calls, seconds) in trainer.profiler.stats.items():
        # the trace reads each event against the step's first, the totals pairwise: CUDA
        # event times are good to about half a microsecond each
        assert sums[key] == pytest.approx(seconds, abs=5e-6 * calls), key


def test_gpu_layout_from_made_up_spans() -> None:
    """The GPU's two tracks, checked here without a GPU: host launches and device times (which
    start later: the launch queue), a fused op's matmul inside it on both, a one-op phase."""
    spans = [  # as the profiler appends them: children first
        OpSpan(0, "matmul", "forward", "matmul", 1.0, 1.1, 1.00005, 1.0003),
        OpSpan(0, "attention.matmul", "forward", "matmul", 1.12, 1.13, 1.0004, 1.0005),
        OpSpan(0, "attention", "forward", "other", 1.11, 1.15, 1.0003, 1.0007),
        OpSpan(0, "adamw", "optimizer", "other", 1.2, 1.25, 1.0008, 1.001),
    ]
    doc = chrome_trace(spans, [7], gpu=True, device="gpu", hardware="H100",
                       profiled_steps=20)
    check_schema(doc)
    check_nesting(doc)
    assert set(tracks(doc)) == {(1, 1), (2, 1)}
    device = {e["name"]: e for e in tracks(doc)[(2, 1)]}
    assert device["step 7"]["ts"] == pytest.approx(50.0)
    assert device["attention"]["dur"] == pytest.approx(400.0)
    assert self_times(doc, 2)[("attention", "forward", "other")] == pytest.approx(300e-6)
    assert self_times(doc, 1)[("attention", "forward", "other")] == pytest.approx(0.03)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and "name" in
             e["args"]}
    assert names == {"host", "main thread: op launches", "GPU gpu (H100)", "stream"}
    assert "the first 1 of 20 profiled steps" in doc["otherData"]["note"]


class FakeEvent:
    """A device event whose clock is the host's: the profiler's GPU path without a GPU."""

    t = 0.0

    def synchronize(self) -> None:
        pass


class FakeGpu:
    kind = "gpu"

    def new_event(self) -> FakeEvent:
        return FakeEvent()

    def record(self, event: FakeEvent) -> None:
        event.t = time.perf_counter()

    def elapsed(self, start: FakeEvent, end: FakeEvent) -> float:
        return end.t - start.t


def test_the_profilers_gpu_path_keeps_spans_that_match_its_totals() -> None:
    def fused() -> None:
        run_op("fused.matmul", "matmul", "forward", time.sleep, 0.002)
        time.sleep(0.001)

    prof = Profiler(FakeGpu(), trace_steps=2)  # type: ignore[arg-type]
    for step in (11, 12, 13):
        with prof:
            run_op("fused", "other", "forward", fused)
            run_op("adamw", "other", "optimizer", time.sleep, 0.001)
        prof.step_end(step)
        if step == 12:  # the traced steps' totals
            traced = {key: tuple(value) for key, value in prof.stats.items()}
    assert prof.steps == 3 and prof.step_numbers == [11, 12]
    assert len(prof.spans) == 6 and all(s.device_start is not None for s in prof.spans)
    doc = chrome_trace(prof.spans, prof.step_numbers, gpu=True, device="gpu", hardware="fake",
                       profiled_steps=prof.steps)
    check_nesting(doc)
    steps = sorted(e["name"] for e in timed(doc) if e["cat"] == "step" and e["pid"] == 2)
    assert steps == ["step 11", "step 12"]
    sums = self_times(doc, 2)
    assert set(sums) == set(traced)
    for key, (calls, seconds) in traced.items():
        assert sums[key] == pytest.approx(seconds, abs=1e-8 * calls), key


def test_the_trace_keeps_only_the_first_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_parts, "TRACE_STEPS", 3)
    Trainer(tiny_cfg(MAX_STEPS=7), quiet, trace="t.json").run()
    meta = json.loads(Path("t.json").read_text())["otherData"]
    assert (meta["steps_traced"], meta["steps_profiled"], meta["max_steps"]) == (3, 7, 20)
    steps = {e["name"] for e in timed(json.loads(Path("t.json").read_text()))
             if e["cat"] == "step"}
    assert steps == {"step 1", "step 2", "step 3"}


def test_an_interrupted_run_still_writes_its_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = Trainer(tiny_cfg(), quiet, trace="t.json")
    real_run = trainer.runner.run

    def run(done: int) -> None:
        real_run(done)
        if done + 1 == 4:
            trainer.parts.signals.requested = 2  # as a Ctrl-C during step 4 would
    monkeypatch.setattr(trainer.runner, "run", run)
    with pytest.raises(Stopped):
        trainer.run()
    doc = json.loads(Path("t.json").read_text())
    assert doc["otherData"]["steps_traced"] == 4
    check_nesting(doc)


def test_trace_from_the_command_line_and_its_errors(
    tiny_dir: Path,
) -> None:
    (tiny_dir / "tiny.env").write_text("".join(f"{k}={v}\n" for k, v in TINY.items()))
    runner = CliRunner()
    ok = runner.invoke(main, ["train", "--config", "tiny.env", "--max-steps", "3", "--profile",
                              "--trace", "traces/run.json"])
    assert ok.exit_code == 0, ok.output
    assert "Trace of 3 profiled steps: traces/run.json" in ok.output
    check_nesting(json.loads((tiny_dir / "traces/run.json").read_text()))
    off = runner.invoke(main, ["train", "--config", "tiny.env", "--no-profile", "--trace",
                               "t.json"])
    assert off.exit_code == 1 and "--trace needs the profiler" in off.output
    folder = runner.invoke(main, ["train", "--config", "tiny.env", "--profile", "--trace",
                                  "traces"])
    assert folder.exit_code != 0
    banner = runner.invoke(main, ["banner", "--config", "tiny.env", "--trace", "t.json"])
    assert banner.exit_code == 0 and "t.json" in banner.output
