"""The profiler that hooks the op choke point (tensor.run_op).

CPU: wall time around each op. GPU: a pair of CUDA events recorded on the stream around each
op and resolved once per step (`step_end`), so timing never synchronizes per op. Ops nested
inside a fused op (its matmuls) are charged to themselves; the parent keeps its self time.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from . import autograd
from .backend import Backend


class Profiler:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.gpu = backend.kind == "gpu"
        # (name, phase, category) -> [calls, seconds]
        self.stats: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
        self._stack: list[list[Any]] = []  # open records: [key, start, child_time | children]
        self._pending: list[tuple[tuple[str, str, str], Any, Any, list[Any]]] = []
        self._events: list[Any] = []
        self._next_event = 0
        self.steps = 0

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
            elapsed = time.perf_counter() - start
            self._stack.pop()
        entry = self.stats[key]
        entry[0] += 1
        entry[1] += elapsed - frame[1]
        if self._stack:
            self._stack[-1][1] += elapsed
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
        start = self._event()
        try:
            out = fn(*args)
        finally:
            self._stack.pop()
        end = self._event()
        if self._stack:
            self._stack[-1].append((start, end))
        self._pending.append((key, start, end, children))
        return out

    def step_end(self) -> None:
        """GPU: wait for the step once and turn its event pairs into times."""
        self.steps += 1
        if not self.gpu or not self._pending:
            return
        elapsed = self.backend.elapsed
        self._pending[-1][2].synchronize()
        for key, start, end, children in self._pending:
            entry = self.stats[key]
            entry[0] += 1
            entry[1] += elapsed(start, end) - sum(elapsed(a, b) for a, b in children)
        self._pending.clear()
        self._next_event = 0

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
