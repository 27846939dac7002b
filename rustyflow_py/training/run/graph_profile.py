"""The per-op profile of the step that runs: sampled replays of the captured CUDA graph.

Once the step is a CUDA graph, an eager step timed op by op describes a step training never
runs (launch-bound, without the graph's fusion of launches). So the profiler tags the graph's
nodes with their ops while the step is captured, and a few of the real training replays are
then run with CUPTI's kernel recording on. Each sampled replay is an ordinary training step:
nothing is replayed twice, nothing is added to the graph.

The samples are spread over the run so that their cost (the device idles while the records
are flushed and read) stays within `BUDGET` of the time since the first replay; the last step
is sampled if nothing was yet, so a short run still gets a profile. A replay is sampled only
once the device has been found busy at `STREAK` launches in a row, as training steps run back
to back: one launched onto a device that just idled (the host waited for it, to read the
losses back) starts cold and is slower than the steps training is made of.

In a data-parallel run every rank samples the same replays: a rank that stops to read its
records makes the others' collectives wait, so a replay sampled by one rank alone would time
that wait as communication. Rank 0 decides (every AGREE_EVERY replays, and at the last) and
broadcasts its decision; the records of each replay are also split into compute, communication
and exposed communication (comm_overlap).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ...engine.comm_overlap import CommAccount
from ...engine.cupti_trace import CuptiTracer, CuptiUnavailable
from ...engine.graph import CapturedStep
from ...engine.kernel_records import KernelAttribution, last_replay
from ...engine.profiler import Profiler

BUDGET = 0.005  # the share of the training time sampling may take (half the promised 1%)
# what a sample is assumed to cost per graph node before one was measured (recording, the
# flush and reading one record each: an upper estimate; the first sample's own cost replaces it)
NODE_COST_S = 1e-4
STREAK = 3  # launches in a row that found the device still running the steps before
AGREE_EVERY = 8  # a data-parallel run's replays per sampling decision shared by the ranks


def choose_mode(asked: str, kind: str, graph: bool, warn: Callable[[str], None]
                ) -> tuple[str, CuptiTracer | None, str | None]:
    """Which profile the run makes: 'wall' (CPU), 'graph' (sampled replays, with its tracer)
    or 'eager' (a window of eager GPU steps timed by events), and why a graph profile fell
    back to the eager window (None when it did not). A graph profile that cannot be made says
    why in one line. A data-parallel step is profiled like any other: its collectives are
    kernels of the captured graph (comm_overlap splits them from the compute)."""
    if kind != "gpu":
        return "wall", None, None
    if asked == "eager":
        return "eager", None, None
    if not graph:
        if asked == "graph":
            warn("WARN: PROFILE_MODE=graph needs the step replayed as a CUDA graph (GRAPH=off "
                 "here): profiling an eager window, which is the step that runs")
        return "eager", None, None
    try:
        return "graph", CuptiTracer(), None
    except CuptiUnavailable as exc:
        warn(f"WARN: per-op profile from an eager window instead of the replayed graph: {exc}")
        return "eager", None, f"CUPTI is unavailable: {exc}"


def shared_mode(choice: tuple[str, CuptiTracer | None, str | None],
                everywhere: Callable[[bool], bool], warn: Callable[[str], None]
                ) -> tuple[str, CuptiTracer | None, str | None]:
    """A data-parallel run's choice: the ranks sample together, so the graph profile only if
    every rank can make it (`everywhere`, a collective every rank calls, says whether all
    ranks have a tracer); else the eager window on every rank."""
    mode, tracer, _ = choice
    if everywhere(tracer is not None) or tracer is None:
        return choice
    why = "CUPTI is unavailable on another rank of this run"
    warn(f"WARN: per-op profile from an eager window instead of the replayed graph: {why}")
    return "eager", None, why


class GraphSampler:
    """Tags the captured step's nodes with ops, then samples its replays into the profiler."""

    def __init__(self, profiler: Profiler, tracer: CuptiTracer, max_samples: int,
                 budget: float | None = BUDGET,
                 busy: Callable[[], bool] = lambda: True,
                 agree: Callable[[bool], bool] | None = None) -> None:
        """`budget`: the share of the training time sampling may take; None samples every
        replay after the first, up to `max_samples` (a benchmark's few steps). `busy`: whether
        the device is still running earlier work (the stream is not done). `agree` (data
        parallel, every rank calls it at the same replays): rank 0's decision, given this
        rank's wish."""
        self.profiler, self.tracer, self.max_samples = profiler, tracer, max_samples
        self.budget, self.busy, self.agree = budget, busy, agree
        self.comm = CommAccount()  # compute against the collectives, per sampled replay
        self._calls = 0  # replays since the first, for a data-parallel run's agreement
        self.samples = 0
        self.cost_s = 0.0  # the device's idle time for the samples (reading their records)
        self.costs: list[float] = []  # each sample's
        self._last_cost = 0.0  # set from the graph's size at capture, then measured
        self._streak = 0  # launches in a row that found the device busy
        self._since: float | None = None  # when the first replay ran

    def capture(self, captured: CapturedStep) -> None:
        """Capture the step with every node tagged by the op that created it."""
        prof = self.profiler
        prof.tagging = True
        try:
            with prof, self.tracer.tag_nodes(prof.current):
                captured.capture()
        finally:
            prof.tagging = False
        prof.graph = KernelAttribution(self.tracer.node_ops)
        self._last_cost = NODE_COST_S * len(self.tracer.node_ops)
        # CUPTI sets its recording up on first use (buffers, the device's clock): do that now,
        # as part of the capture's start-up, rather than inside the first sample
        self.tracer.records(lambda: None, captured.backend.synchronize)

    def due(self, last: bool) -> bool:
        """Whether this replay is to be sampled (`last`: the run's final step). In a
        data-parallel run every rank calls this for the same replays with the same `last`
        (the step limit, which the ranks share; an agreed stop ends them all before it), so
        the agreement's broadcasts pair up: `last` must never come from one rank's state."""
        now = time.perf_counter()
        if self._since is None:
            self._since = now
            return False  # the first replay warms the graph up
        if self.samples >= self.max_samples:
            return False
        want = self._wants(last, now)
        if self.agree is None:
            return want
        self._calls += 1
        if not last and self._calls % AGREE_EVERY:
            return False
        return self.agree(want)

    def _wants(self, last: bool, now: float) -> bool:
        """This rank's decision: within the budget, with the device found busy."""
        if last and self.samples == 0:
            return True
        if self.budget is not None and (
                self.cost_s + self._last_cost > self.budget * (now - self._since)):
            return False
        self._streak = self._streak + 1 if self.busy() else 0
        return self._streak >= STREAK

    def sample(self, replay: Callable[[], None], synchronize: Callable[[], None],
               step: int = 0) -> None:
        """Run one replay (training step number `step`) with kernel recording on and add its
        records to the profile. Its cost is the time the device then idles for it: from the
        replay's end (the steps queued before it are training's own work) until the records
        are read and attributed."""
        records = last_replay(self.tracer.records(replay, synchronize))
        start = time.perf_counter()
        graph = self.profiler.graph
        assert graph is not None, "sample() before capture()"
        graph.add_replay(records, step)
        self.comm.add(graph.tag(records))
        self._last_cost = self.tracer.read_s + time.perf_counter() - start
        self.cost_s += self._last_cost
        self.costs.append(self._last_cost)
        self._streak = 0  # the sample waited for the device: it is idle again
        self.samples += 1
        self.profiler.steps = self.samples

    def summary(self) -> dict[str, Any]:
        """What the record keeps of the sampling: how many, what it cost, the totals."""
        graph = self.profiler.graph
        totals = graph.totals() if graph is not None else {}
        comm = self.comm.summary()
        return {"samples": self.samples, "cost_s": self.cost_s, **totals,
                "sample_costs_s": [round(c, 6) for c in self.costs[:50]],
                "nodes_tagged": len(self.tracer.node_ops), **({"comm": comm} if comm else {})}
