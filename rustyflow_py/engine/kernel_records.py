"""Kernel records of replayed CUDA-graph steps, attributed to the ops that launched them.

A captured step is a fixed list of graph nodes. While it is captured, the profiler knows which
op is running, so every node the capture creates can be tagged with that op (see
cupti_trace.CuptiTracer). A replay then yields one record per kernel, memset or memcpy it ran,
each naming its graph node: the op of every record is a lookup, exact by construction, and a
record whose node was never tagged is kept as "(unattributed)" so that nothing is dropped.

This module is the pure part: records in, per-op and per-kernel device times out, with the
device-busy time (the union of the record intervals) to check the per-op sum against. It knows
nothing of CUDA, so it is tested on synthetic records.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

OpKey = tuple[str, str, str]  # (name, phase, category), as the profiler keys its stats
UNATTRIBUTED: OpKey = ("(unattributed)", "-", "other")


class KernelRecord(NamedTuple):
    """One kernel (or memset/memcpy) of a replay, device timestamps in nanoseconds."""

    name: str
    start_ns: int
    end_ns: int
    node: int  # the graph node that ran it (0: not launched from a graph)
    stream: int = 0  # the CUDA stream it ran on (a data-parallel step's collectives: a second)


def busy_ns(records: Iterable[KernelRecord]) -> int:
    """The union of the records' intervals: the time the device was running any of them."""
    total, end = 0, None
    for r in sorted(records, key=lambda r: r.start_ns):
        if end is None or r.start_ns >= end:
            total += r.end_ns - r.start_ns
            end = r.end_ns
        elif r.end_ns > end:
            total += r.end_ns - end
            end = r.end_ns
    return total


def last_replay(records: list[KernelRecord]) -> list[KernelRecord]:
    """The records of the last replay among `records`: a graph runs each of its nodes once a
    replay, so that is the last record of each node. (Recording switched on while an earlier
    replay is still running may catch the end of it too.)"""
    last: dict[int, KernelRecord] = {}
    for r in sorted(records, key=lambda r: r.start_ns):
        last[r.node] = r
    return sorted(last.values(), key=lambda r: r.start_ns)


class KernelAttribution:
    """Per-op and per-kernel device times over the sampled replays of one captured step.

    `node_ops` maps each graph node id to the op that created it (clones already resolved).
    """

    def __init__(self, node_ops: Mapping[int, OpKey]) -> None:
        self.node_ops = dict(node_ops)
        self.replays = 0
        self.kernel_ns = 0  # the sum of every record's duration
        self.busy_ns = 0  # the union of the record intervals, per replay, summed
        self.span_ns = 0  # first start to last end, per replay, summed: the step on the device
        # op -> kernel name -> [records, ns]
        self._kernels: dict[OpKey, dict[str, list[int]]] = defaultdict(
            lambda: defaultdict(lambda: [0, 0]))
        self.first: list[tuple[OpKey, KernelRecord]] = []  # the first replay, for a timeline
        self.first_step = 0  # its training step number

    def add_replay(self, records: list[KernelRecord], step: int = 0) -> None:
        """One replay's records (all of them: a partial replay would skew every share), of
        training step number `step`."""
        if not records:
            return
        tagged = self.tag(records)
        for op, r in tagged:
            entry = self._kernels[op][r.name]
            entry[0] += 1
            entry[1] += r.end_ns - r.start_ns
        self.kernel_ns += sum(r.end_ns - r.start_ns for r in records)
        self.busy_ns += busy_ns(records)
        self.span_ns += max(r.end_ns for r in records) - min(r.start_ns for r in records)
        if not self.replays:
            self.first = sorted(tagged, key=lambda t: t[1].start_ns)
            self.first_step = step
        self.replays += 1

    def tag(self, records: list[KernelRecord]) -> list[tuple[OpKey, KernelRecord]]:
        """Each record with the op of its graph node."""
        return [(self.node_ops.get(r.node, UNATTRIBUTED), r) for r in records]

    def op_times(self) -> dict[OpKey, float]:
        """Seconds of kernel time per op over all sampled replays."""
        return {op: sum(ns for _, ns in by_name.values()) / 1e9
                for op, by_name in self._kernels.items()}

    def kernels(self, op: OpKey) -> list[dict[str, Any]]:
        """The op's kernels, longest first: name, records per replay, seconds in all."""
        n = max(self.replays, 1)
        rows = [{"name": name, "calls_per_step": count / n, "time_s": ns / 1e9}
                for name, (count, ns) in self._kernels.get(op, {}).items()]
        return sorted(rows, key=lambda k: -k["time_s"])

    def totals(self) -> dict[str, float]:
        """Seconds over the sampled replays: kernel sum, device busy, step span."""
        return {"kernel_s": self.kernel_ns / 1e9, "busy_s": self.busy_ns / 1e9,
                "span_s": self.span_ns / 1e9, "replays": self.replays}


def short_kernel_name(name: str, limit: int = 80) -> str:
    """A kernel's name for a table: no return type, no parameter list, at most `limit`
    characters (`void cutlass::Kernel2<cutlass_80_..._gemm_...>(Params)` -> `cutlass::Kernel2
    <cutlass_80_..._gemm_...>`); the record keeps the full name."""
    text = name[5:] if name.startswith("void ") else name
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            text = text[:i]
            break
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
