"""The profiler that hooks the op choke point (autograd.run_op) inside its `with` block.

Three ways to time an op, one per way a step runs:
- CPU (`wall`): wall time around each op of every step.
- GPU eager window (`events`): a pair of CUDA events recorded on the stream around each op and
  resolved once per step (`step_end`), so timing never synchronizes per op. This describes an
  eager step, which training does not run once the step is a CUDA graph: PROFILE_MODE=eager.
- GPU graph (`tag`, the default): while the step is captured the profiler only says which op is
  running (`current`), so that CUPTI can tag every graph node with its op; the times then come
  from kernel records of sampled replays (`graph`, a kernel_records.KernelAttribution).

Ops nested inside a fused op (its matmuls) are charged to themselves; the parent keeps its
self time. Every mode also counts each op's work (op_cost): GEMM FLOPs and shapes, and the
bytes its arrays hold, for the roofline.

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
from .kernel_records import KernelAttribution, OpKey
from .op_cost import gemm_cost, op_bytes


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
        self.stats: dict[OpKey, list[float]] = defaultdict(lambda: [0, 0.0])
        # (name, phase, category) -> [FLOPs, bytes] over the same calls, and the GEMM shapes
        self.costs: dict[OpKey, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.shapes: dict[OpKey, dict[tuple[tuple[int, ...], str], int]] = defaultdict(dict)
        self._open: list[OpKey] = []  # the ops running now, innermost last
        self._stack: list[list[Any]] = []  # open records: [key, start, child_time | children]
        # GPU: (key, start event, end event, children's event pairs, host start, host end)
        self._pending: list[tuple[OpKey, Any, Any, list[Any], float, float]] = []
        self._events: list[Any] = []
        self._next_event = 0
        self.steps = 0
        self.tagging = False  # capturing: only say which op runs (see `current`)
        self.graph: KernelAttribution | None = None  # the sampled replays' kernel times
        self.trace_steps = trace_steps
        self.spans: list[OpSpan] = []  # the ops of the first `trace_steps` steps
        self.step_numbers: list[int] = []  # the training step number of each traced step
        self._attached: list[Any] = []  # the context tokens of the open `with` blocks

    # ---- attaching -----------------------------------------------------------------------------
    def __enter__(self) -> Profiler:
        """Attach to the choke point for the block, in the caller's context (autograd)."""
        self._attached.append(autograd.attach_profiler(self))
        return self

    def __exit__(self, *exc: object) -> None:
        autograd.detach_profiler(self._attached.pop())

    # ---- the hook --------------------------------------------------------------------------------
    def record(self, name: str, category: str, phase: str, fn: Any, args: tuple[Any, ...],
               saved: Any = None) -> Any:
        key = (name, phase, category)
        self._open.append(key)
        try:
            if self.tagging:
                out = fn(*args)
                self.stats[key][0] += 1
            elif self.gpu:
                out = self._record_gpu(key, fn, args)
            else:
                out = self._record_cpu(key, fn, args)
        finally:
            self._open.pop()
        self.costs[key][1] += op_bytes(args, out, saved)
        return out

    def current(self) -> OpKey | None:
        """The innermost op running now (None between ops)."""
        return self._open[-1] if self._open else None

    def add_gemm(self, a: Any, product: Any) -> None:
        """A GEMM A @ B -> product ran inside the current op: add its FLOPs and shape."""
        key, cost = self.current(), gemm_cost(a, product)
        if key is None or cost is None:
            return
        flops, shape, dtypes = cost
        self.costs[key][0] += flops
        seen = self.shapes[key]
        seen[(shape, dtypes)] = seen.get((shape, dtypes), 0) + 1

    def _record_cpu(self, key: OpKey, fn: Any, args: tuple[Any, ...]) -> Any:
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
            self.spans.append(OpSpan(self.steps, *key, start, end, None, None))
        return out

    def _event(self) -> Any:
        if self._next_event == len(self._events):
            self._events.append(self.backend.new_event())
        ev = self._events[self._next_event]
        self._next_event += 1
        self.backend.record(ev)
        return ev

    def _record_gpu(self, key: OpKey, fn: Any, args: tuple[Any, ...]) -> Any:
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
        """One row per op: calls and seconds over the profiled steps, its work (FLOPs, bytes,
        GEMM shapes) and, from graph replays, its kernels. Longest first."""
        if self.graph is not None:
            times = self.graph.op_times()
            scale = self.graph.replays  # the capture saw one step; the replays repeat it
            keys = set(times) | set(self.stats)
        else:
            times = {k: v[1] for k, v in self.stats.items()}
            scale, keys = 1, set(self.stats)
        rows = []
        for key in keys:
            name, phase, category = key
            flops, nbytes = self.costs.get(key, (0.0, 0.0))
            row = {"name": name, "category": category, "phase": phase,
                   "calls": int(self.stats[key][0] * scale) if key in self.stats else 0,
                   "time_s": times.get(key, 0.0), "flops": flops * scale,
                   "bytes": nbytes * scale}
            if key in self.shapes:
                row["gemms"] = [{"shape": list(shape), "dtypes": dtypes, "calls": n}
                                for (shape, dtypes), n in self.shapes[key].items()]
            if self.graph is not None:
                row["kernels"] = self.graph.kernels(key)
            rows.append(row)
        return sorted(rows, key=lambda r: -r["time_s"])

    def phase_times(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for row in self.ops():
            out[row["phase"]] += row["time_s"]
        return dict(out)

    def total(self, category: str | None = None) -> float:
        return sum(r["time_s"] for r in self.ops() if category in (None, r["category"]))
