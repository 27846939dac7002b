"""Every kernel of a replayed CUDA-graph step, as markdown: the before/after record of a fusion.

The records come from the graph profile that training makes (`rustyflow train --profile-mode
graph`): the step's graph nodes are tagged with their ops while it is captured
(`training.run.graph_profile.GraphSampler`, CUPTI resource callbacks), then sampled replays run
with CUPTI's kernel recording on (`engine.kernel_records.KernelAttribution`). This module only
drives that machinery for a benchmark's step and lays the result out by kernel name, so two
lists taken before and after a change can be compared line by line.

`vs_pytorch.py --kernel-list FILE` uses it on its rustyflow graph rows, after their timing: the
sampled replays come after the timed ones and never count in the step times.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from rustyflow_py.engine.cupti_trace import CuptiTracer, CuptiUnavailable
from rustyflow_py.engine.kernel_records import KernelAttribution, short_kernel_name
from rustyflow_py.engine.profiler import Profiler
from rustyflow_py.training.run.graph_profile import GraphSampler

AHEAD = 2  # ordinary replays queued before each sampled one, so it starts on a busy device


class KernelLister:
    """One CUPTI tracer for the whole process (CUPTI takes one subscriber, and stays loaded
    once used), and a sampler for each captured step."""

    def __init__(self, samples: int) -> None:
        if samples < 1:
            raise ValueError(f"--kernel-samples must be at least 1, got {samples}")
        self.samples = samples
        self._tracer: CuptiTracer | None = None
        self.unavailable: str | None = None  # why there is no kernel list, once known

    def sampler(self, backend: Any) -> GraphSampler | None:
        """A sampler whose `capture` tags the step's nodes; None (and `unavailable` says why)
        when CUPTI cannot trace here."""
        if self._tracer is None and self.unavailable is None:
            try:
                self._tracer = CuptiTracer()
            except CuptiUnavailable as exc:
                self.unavailable = str(exc)
        if self._tracer is None:
            return None
        return GraphSampler(Profiler(backend), self._tracer, self.samples, budget=None)

    def capture(self, sampler: GraphSampler, captured: Any) -> None:
        """Capture `captured` with its nodes tagged by their ops; when CUPTI refuses now
        (another tool took it), capture it untagged and say why there is no list, as a
        training run does."""
        try:
            sampler.capture(captured)
        except CuptiUnavailable as exc:
            self.unavailable = str(exc)
            captured.capture()

    def sample(self, sampler: GraphSampler, replay: Callable[[], None],
               synchronize: Callable[[], None]) -> KernelAttribution:
        """`samples` recorded replays, each queued behind AHEAD ordinary ones (as training's
        sampled replays run behind the steps before them); their attribution."""
        for _ in range(self.samples):
            for _ in range(AHEAD):
                replay()
            sampler.sample(replay, synchronize)
        graph = sampler.profiler.graph
        assert graph is not None, "sample() before the capture"
        return graph


def by_kernel(graph: KernelAttribution) -> list[dict[str, Any]]:
    """One row per kernel name, longest first: ms and launches per replayed step, and the
    ops (name [phase]) that launch it."""
    n = max(graph.replays, 1)
    rows: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"ms": 0.0, "calls": 0.0, "ops": set()})
    for op in graph.op_times():
        for k in graph.kernels(op):
            row = rows[k["name"]]
            row["ms"] += 1e3 * k["time_s"] / n
            row["calls"] += k["calls_per_step"]
            row["ops"].add(f"{op[0]} [{op[1]}]")
    return sorted(({"name": name, **row} for name, row in rows.items()),
                  key=lambda r: -r["ms"])


def by_category(graph: KernelAttribution) -> list[tuple[str, float]]:
    """Kernel ms per replayed step by the profiler's op category, longest first."""
    n = max(graph.replays, 1)
    totals: dict[str, float] = defaultdict(float)
    for op, seconds in graph.op_times().items():
        totals[op[2]] += 1e3 * seconds / n
    return sorted(totals.items(), key=lambda item: -item[1])


def render(title: str, graph: KernelAttribution) -> list[str]:
    """A markdown section: the replayed step on the device, the time by op category, and
    every kernel by name with its share of the step."""
    totals = graph.totals()
    n = max(int(totals["replays"]), 1)
    span, busy = 1e3 * totals["span_s"] / n, 1e3 * totals["busy_s"] / n
    kernels = by_kernel(graph)
    launches = sum(k["calls"] for k in kernels)
    lines = [f"## {title}", "",
             f"{n} sampled replays. Replayed step on the device: {span:.3f} ms (kernels busy "
             f"{busy:.3f} ms, idle between kernels {span - busy:.3f} ms); "
             f"{launches:g} kernels a step, {len(kernels)} distinct.", "",
             "| op category | ms/step | share of step |", "|---|---:|---:|"]
    lines += [f"| {cat} | {ms:.3f} | {ms / span:.1%} |" for cat, ms in by_category(graph)]
    lines += ["", "| kernel | ms/step | share of step | launches/step | launched by |",
              "|---|---:|---:|---:|---|"]
    for k in kernels:
        ops = ", ".join(sorted(k["ops"]))
        lines.append(f"| `{short_kernel_name(k['name'], 100)}` | {k['ms']:.3f} | "
                     f"{k['ms'] / span:.1%} | {k['calls']:g} | {ops} |")
    return lines + [""]
