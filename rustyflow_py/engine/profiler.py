"""The profiler that hooks the op choke point (tensor.run_op).

CPU: wall time around each op. GPU: a pair of CUDA events recorded on the stream around each
op and resolved once per step (`step_end`), so timing never synchronizes per op. Ops nested
inside a fused op (its matmuls) are charged to themselves; the parent keeps its self time.

For a timeline (`rustyflow train --trace`), the first `trace_steps` profiled steps also keep
each op's start and end (`spans`): host times around its launch, and on the GPU its device
times, placed on the host clock at the step's first event (the previous step was waited for,
so the device is then at most the step's batch gather behind the host). Only those steps, so
the memory stays bounded on long runs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, NamedTuple

from . import autograd
from .backend import Backend


class OpSpan(NamedTuple):
    """One op of a traced step, in perf_counter seconds. On the CPU the host runs the op
    itself, so its device times are None (the host times are the op's time)."""

    step: int  # which traced step: an index into Profiler.step_numbers
    name: str
    phase: str
    category: str
    host_start: float
    host_end: float
    device_start: float | None
    device_end: float | None


class Profiler:
    def __init__(self, backend: Backend, trace_steps: int = 0) -> None:
        self.backend = backend
        self.gpu = backend.kind == "gpu"
        # (name, phase, category) -> [calls, seconds]
        self.stats: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
        self._stack: list[list[Any]] = []  # open records: [key, start, child_time | children]
        # GPU: (key, start event, end event, children's event pairs, host start, host end)
        self._pending: list[tuple[tuple[str, str, str], Any, Any, list[Any], float, float]] = []
        self._events: list[Any] = []
        self._next_event = 0
        self.steps = 0
        self.trace_steps = trace_steps
        self.spans: list[OpSpan] = []  # the ops of the first `trace_steps` steps
        self.step_numbers: list[int] = []  # the training step number of each traced step

    # ---- attaching -----------------------------------------------------------------------------
    def __enter__(self) -> Profiler:
        self._previous = autograd.set_profiler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        autograd.set_profiler(self._previous)

    # ---- the hook --------------------------------------------------------------------------------
    def record(self, name: str, category: str, phase: str, fn: Any, args: tuple[Any, ...]) -> Any:
        key = (name, phase, category)
        if self.gpu:
            return self._record_gpu(key, fn, args)
        frame = [key, 0.0]
        self._stack.append(frame)
        start = time.perf_counter()
        try:
            out = fn(*args)
        finally:
            end = time.perf_counter()
            self._stack.pop()
        elapsed = end - start
        entry = self.stats[key]
        entry[0] += 1
        entry[1] += elapsed - frame[1]
        if self._stack:
            self._stack[-1][1] += elapsed
        if self.steps < self.trace_steps:
            self.spans.append(OpSpan(self.steps, name, phase, category, start, end, None, None))
        return out

    def _event(self) -> Any:
        if self._next_event == len(self._events):
            self._events.append(self.backend.new_event())
        ev = self._events[self._next_event]
        self._next_event += 1
        self.backend.record(ev)
        return ev

    def _record_gpu(self, key: tuple[str, str, str], fn: Any, args: tuple[Any, ...]) -> Any:
        children: list[Any] = []
        self._stack.append(children)
        host_start = time.perf_counter()
        start = self._event()
        try:
            out = fn(*args)
        finally:
            self._stack.pop()
        end = self._event()
        host_end = time.perf_counter()
        if self._stack:
            self._stack[-1].append((start, end))
        self._pending.append((key, start, end, children, host_start, host_end))
        return out

    def step_end(self, step: int | None = None) -> None:
        """The profiled step (training step number `step`, default its count) is done. GPU:
        wait for it once and turn its event pairs into times."""
        traced = self.steps < self.trace_steps
        if traced:
            self.step_numbers.append(self.steps + 1 if step is None else step)
        if self.gpu and self._pending:
            self._pending[-1][2].synchronize()
            if traced:
                self._trace_gpu()
            self._resolve_gpu()
        self.steps += 1

    def _resolve_gpu(self) -> None:
        """Charge each op of the (finished) step its device time less its children's."""
        elapsed = self.backend.elapsed
        for key, start, end, children, _, _ in self._pending:
            entry = self.stats[key]
            entry[0] += 1
            entry[1] += elapsed(start, end) - sum(elapsed(a, b) for a, b in children)
        self._pending.clear()
        self._next_event = 0

    def _trace_gpu(self) -> None:
        """The step's spans: device times are the events' offsets from the step's first event
        (`_events[0]`), placed at the host time it was recorded."""
        elapsed, ref = self.backend.elapsed, self._events[0]
        anchor = min(p[4] for p in self._pending)  # the first op's host start, just before ref
        for (name, phase, category), start, end, _, host_start, host_end in self._pending:
            self.spans.append(OpSpan(self.steps, name, phase, category, host_start, host_end,
                                     anchor + elapsed(ref, start), anchor + elapsed(ref, end)))

    # ---- results -----------------------------------------------------------------------------
    def ops(self) -> list[dict[str, Any]]:
        rows = [
            {"name": n, "category": c, "phase": p, "calls": int(calls), "time_s": secs}
            for (n, p, c), (calls, secs) in self.stats.items()
        ]
        return sorted(rows, key=lambda r: -r["time_s"])

    def phase_times(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for (_, phase, _), (_, secs) in self.stats.items():
            out[phase] += secs
        return dict(out)

    def total(self, category: str | None = None) -> float:
        return sum(s for (_, _, c), (_, s) in self.stats.items() if category in (None, c))
