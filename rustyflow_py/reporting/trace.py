"""The profiled steps as a Chrome trace (`rustyflow train --trace FILE.json`), for
ui.perfetto.dev and chrome://tracing.

The file is the Trace Event Format's JSON Object Format: ``{"otherData": {...},
"traceEvents": [...], "displayTimeUnit": "ms"}``, ``otherData`` first so that the file's first
bytes carry its producer (the mark a later run checks before writing over it). Every timed
event is a complete ("X") event with ``ts`` and ``dur`` in microseconds from the first traced
op; ``M`` events name the tracks.
On each track the events nest: ``step N`` > phase (forward, backward, optimizer) > op > the
matmuls a fused op runs inside itself. Tracks:

- GPU runs: ``host`` / ``main thread: op launches``, the wall time the host spent issuing each
  op, and ``GPU`` / ``stream``, each op's device time from the profiler's CUDA events.
- CPU runs: the host runs each op itself, so one track, ``host`` / ``main thread``, holds the
  ops' wall times: the profiler's own timing.

Only the first profiled steps are kept (the cap is in ``otherData``), so a long run's trace
stays small. This module only formats: the profiler records the spans.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from ..engine.kernel_records import KernelRecord, OpKey, short_kernel_name
from ..engine.profiler import OpSpan

MAX_STEPS = 20  # profiled steps a trace keeps
PRODUCER = "rustyflow train --trace"  # the mark a trace file starts with
HOST_PID, DEVICE_PID, TID = 1, 2, 1

Times = Callable[[OpSpan], tuple[float, float]]


def chrome_trace(spans: Sequence[OpSpan], step_numbers: Sequence[int], *, gpu: bool,
                 device: str, hardware: str, profiled_steps: int,
                 cap: int = MAX_STEPS) -> dict[str, Any]:
    """The trace document of the profiler's `spans` (see the module docstring)."""
    t0 = min((s.host_start for s in spans), default=0.0)
    events: list[dict[str, Any]] = [
        _meta("process_name", HOST_PID, {"name": f"host ({hardware})" if not gpu else "host"}),
        _meta("thread_name", HOST_PID, {"name": "main thread: op launches" if gpu
                                        else "main thread"}),
        _meta("process_sort_index", HOST_PID, {"sort_index": 0}),
    ]
    events += _track(spans, step_numbers, lambda s: (s.host_start, s.host_end), HOST_PID, t0)
    if gpu:
        events += [
            _meta("process_name", DEVICE_PID, {"name": f"GPU {device} ({hardware})"}),
            _meta("thread_name", DEVICE_PID, {"name": "stream"}),
            _meta("process_sort_index", DEVICE_PID, {"sort_index": 1}),
        ]
        events += _track(spans, step_numbers, _device_times, DEVICE_PID, t0)
    traced = len(step_numbers)
    what = ("host: wall time spent launching each op; GPU stream: device time from CUDA "
            "events, placed at the host time of each step's first event" if gpu
            else "wall time of each op on the main thread (the host runs the ops itself)")
    return marked({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": PRODUCER,
            "device": device,
            "hardware": hardware,
            "timing": "cuda-events" if gpu else "wall",
            "steps_traced": traced,
            "steps_profiled": profiled_steps,
            "max_steps": cap,
            "note": f"the first {traced} of {profiled_steps} profiled steps (at most {cap} are "
                    f"traced); {what}",
        },
    })


def _device_times(span: OpSpan) -> tuple[float, float]:
    assert span.device_start is not None and span.device_end is not None
    return span.device_start, span.device_end


def _meta(name: str, pid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": TID, "args": args}


def _track(spans: Sequence[OpSpan], step_numbers: Sequence[int], times: Times, pid: int,
           t0: float) -> list[dict[str, Any]]:
    """One track's events: each step, its phases (from their first op's start to their last
    op's end) and its ops."""
    by_step: dict[int, list[OpSpan]] = defaultdict(list)
    for span in spans:
        by_step[span.step].append(span)
    events = []
    for index, ops in sorted(by_step.items()):
        step = step_numbers[index]
        phases: dict[str, list[float]] = {}
        for op in ops:
            start, end = times(op)
            events.append(_x(op.name, op.category, pid, start, end, t0,
                             {"step": step, "phase": op.phase, "category": op.category}))
            lo_hi = phases.setdefault(op.phase, [start, end])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], start), max(lo_hi[1], end)
        for phase, (start, end) in phases.items():
            events.append(_x(phase, "phase", pid, start, end, t0, {"step": step}))
        first = min(lo for lo, _ in phases.values())
        last = max(hi for _, hi in phases.values())
        events.append(_x(f"step {step}", "step", pid, first, last, t0, {"step": step}))
    # parents before their children: by start, the longer first, and on a tie (a phase of
    # one op) the step before its phase before its op
    rank = {"step": 0, "phase": 1}
    events.sort(key=lambda e: (e["ts"], -e["dur"], rank.get(e["cat"], 2)))
    return events


def _x(name: str, cat: str, pid: int, start: float, end: float, t0: float,
       args: dict[str, Any], tid: int = TID) -> dict[str, Any]:
    """A complete event; start and end are rounded to the nanosecond each (not the duration),
    so an event that lies inside another still does after rounding."""
    ts, stop = round((start - t0) * 1e6, 3), round((end - t0) * 1e6, 3)
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": round(stop - ts, 3),
            "pid": pid, "tid": tid, "args": args}


def graph_trace(first: Sequence[tuple[OpKey, KernelRecord]], step: int, *, device: str,
                hardware: str, replays: int) -> dict[str, Any]:
    """The trace of a graph profile: one sampled replay of the captured step on the device,
    from its kernel records. Track ``ops``: step > phase > op, each op from its first kernel's
    start to its last kernel's end (consecutive kernels of one op make one slice); track
    ``kernels``: every kernel, memset and memcpy, named, with its op in the arguments."""
    spans: list[OpSpan] = []
    for op, r in first:
        start, end = r.start_ns / 1e9, r.end_ns / 1e9
        if spans and (spans[-1].name, spans[-1].phase, spans[-1].category) == op:
            last = spans[-1]
            spans[-1] = last._replace(host_end=end, device_end=end)
        else:
            spans.append(OpSpan(0, *op, start, end, start, end))
    t0 = min((s.device_start or 0.0 for s in spans), default=0.0)
    kernels = [_x(short_kernel_name(r.name), "kernel", DEVICE_PID, r.start_ns / 1e9,
                  r.end_ns / 1e9, t0, {"op": op[0], "phase": op[1], "kernel": r.name},
                  tid=TID + 1) for op, r in first]
    return marked({
        "traceEvents": [
            _meta("process_name", DEVICE_PID, {"name": f"GPU {device} ({hardware})"}),
            _meta("thread_name", DEVICE_PID, {"name": "ops (from their kernels)"}),
            {"name": "thread_name", "ph": "M", "pid": DEVICE_PID, "tid": TID + 1,
             "args": {"name": "kernels"}},
            *_track(spans, [step], _device_times, DEVICE_PID, t0),
            *kernels,
        ],
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": PRODUCER, "device": device, "hardware": hardware,
            "timing": "cupti-graph", "steps_traced": 1, "steps_profiled": replays,
            "note": f"replayed CUDA-graph step {step}, the first of {replays} sampled replays: "
                    "device times from CUPTI kernel records, each kernel tagged with its op "
                    "when the step was captured",
        },
    })


def marked(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with its `otherData` (the producer first) as the first key, so the file starts
    with the mark."""
    other = doc["otherData"]
    return {"otherData": {"producer": other["producer"], **other}, **doc}
