"""Compute against communication in a replayed data-parallel step, from its kernel records.

A data-parallel step runs its collectives (NCCL kernels) on a second stream while backward
goes on computing, so a collective's own time says little about what it costs the step: only
the stretches in which the device runs communication and nothing else slow the step down.
From the records of one replay (every kernel with its op, on both streams) this computes:

- compute: the union of the intervals of every non-communication kernel;
- communication: the union of the intervals of the communication kernels;
- exposed communication: the time in which communication runs and no compute does
  (busy - compute, where busy is the union of all the intervals);
- overlap: the share of the communication hidden behind compute.

Each collective op (a gradient bucket's `all_reduce[k]`, ZeRO-1's `reduce_scatter` and
`all_gather`, the loss's `all_reduce_loss`) gets the same split, and which stream it ran on.
Pure: records in, numbers out, so it is tested on synthetic records.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from .kernel_records import KernelRecord, OpKey, busy_ns

COMM = "comm"  # the category of the collectives' ops


def is_comm(op: OpKey, kernel: str) -> bool:
    """Whether a kernel is communication: its op is a collective, or it is an NCCL kernel
    whatever op launched it (a collective is communication even if its node was mis-tagged)."""
    return op[2] == COMM or kernel.startswith("nccl")


def merged(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of `intervals` as disjoint (start, end) pairs, in order."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        elif end > start:
            out.append((start, end))
    return out


def uncovered_ns(intervals: Iterable[tuple[int, int]], cover: list[tuple[int, int]]) -> int:
    """How long the union of `intervals` runs outside `cover` (disjoint and in order, as
    `merged` returns it)."""
    total, j = 0, 0
    for start, end in merged(intervals):
        while j < len(cover) and cover[j][1] <= start:
            j += 1
        at, k = start, j
        while at < end:
            if k == len(cover) or cover[k][0] >= end:
                total += end - at
                break
            if cover[k][0] > at:
                total += cover[k][0] - at
            at = max(at, cover[k][1])
            k += 1
    return total


def _span(r: KernelRecord) -> tuple[int, int]:
    return r.start_ns, r.end_ns


class CommAccount:
    """Compute, communication and exposed communication summed over the sampled replays, for
    the step and for each collective op."""

    def __init__(self) -> None:
        self.replays = 0
        self.compute_ns = self.comm_ns = self.exposed_ns = 0
        # collective op -> [kernel ns, union ns, exposed ns]
        self._ops: dict[OpKey, list[int]] = defaultdict(lambda: [0, 0, 0])
        self._streams: dict[OpKey, Counter[int]] = defaultdict(Counter)
        self._compute_streams: Counter[int] = Counter()  # stream -> compute kernel ns

    def add(self, tagged: list[tuple[OpKey, KernelRecord]]) -> None:
        """One replay's records, each with its op (KernelAttribution.tag)."""
        if not tagged:
            return
        compute = [r for op, r in tagged if not is_comm(op, r.name)]
        comm: dict[OpKey, list[KernelRecord]] = defaultdict(list)
        for op, r in tagged:
            if is_comm(op, r.name):
                comm[op].append(r)
        cover = merged(map(_span, compute))
        every = [r for rs in comm.values() for r in rs]
        self.compute_ns += sum(end - start for start, end in cover)
        self.comm_ns += busy_ns(every)
        self.exposed_ns += uncovered_ns(map(_span, every), cover)
        for r in compute:
            self._compute_streams[r.stream] += r.end_ns - r.start_ns
        for op, rs in comm.items():
            entry = self._ops[op]
            entry[0] += sum(r.end_ns - r.start_ns for r in rs)
            entry[1] += busy_ns(rs)
            entry[2] += uncovered_ns(map(_span, rs), cover)
            for r in rs:
                self._streams[op][r.stream] += r.end_ns - r.start_ns
        self.replays += 1

    def summary(self) -> dict[str, Any] | None:
        """Seconds over the replays (the record's `profile.comm`); None when no replay ran a
        collective (one process)."""
        if not self._ops:
            return None
        main = (self._compute_streams.most_common(1)[0][0] if self._compute_streams
                else None)
        ops = [{"name": name, "phase": phase, "time_s": kernel / 1e9, "union_s": union / 1e9,
                "exposed_s": exposed / 1e9,
                "side_stream": self._streams[(name, phase, cat)].most_common(1)[0][0] != main}
               for (name, phase, cat), (kernel, union, exposed) in self._ops.items()]
        return {"replays": self.replays, "compute_s": self.compute_ns / 1e9,
                "comm_s": self.comm_ns / 1e9, "exposed_s": self.exposed_ns / 1e9,
                "overlap_pct": overlap_pct(self.comm_ns, self.exposed_ns),
                "ops": sorted(ops, key=lambda o: -o["time_s"])}


def overlap_pct(comm: float, exposed: float) -> float | None:
    """The share of the communication hidden behind compute, in percent (None without any)."""
    return 100.0 * (comm - exposed) / comm if comm > 0 else None
