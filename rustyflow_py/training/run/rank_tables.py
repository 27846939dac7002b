"""Every rank's figures, gathered at rank 0 for the run record.

Only rank 0 writes the record, but in a data-parallel run each rank has its own clock and its
own profile: a rank that computes slower makes the others wait in their collectives, and
rank 0's table alone would never show it. So at the end of the run every rank sends rank 0
(one MPI gather) its training time and steps and its per-op times per step; the record keeps
each rank's throughput (`parallel.ranks`) and, for the profile, each op's minimum, median and
maximum over the ranks with the slowest rank's step against the median (`profile.ranks`).
"""

from __future__ import annotations

import statistics
from typing import Any

from .parts import RunParts


def rank_figures(parts: RunParts) -> dict[str, Any]:
    """This rank's figures: its training time, counted steps and tokens/s (its share of each
    step's tokens), and, when it profiled, its per-op times and its step time per step."""
    seconds, counted = parts.clock.trained
    tokens = counted * parts.tokens_per_step / parts.world.size
    fig: dict[str, Any] = {"rank": parts.world.rank, "steps_time_s": seconds,
                           "timed_steps": counted,
                           "tokens_per_s": tokens / seconds if seconds > 0 else None}
    prof = parts.profiler
    if prof is None or not prof.steps:
        return fig
    sampler = parts.runner.sampler
    if prof.graph is not None and sampler is not None and prof.graph.replays:
        n = prof.graph.replays
        sampling = sampler.summary()
        fig["step_s"] = sampling.get("span_s", 0.0) / n
        fig["busy_s"] = sampling.get("busy_s", 0.0) / n
        comm = sampling.get("comm")
        if comm:
            fig["compute_s"] = comm["compute_s"] / n
            fig["exposed_s"] = comm["exposed_s"] / n
            fig["comm_s"] = comm["comm_s"] / n
    else:
        n = prof.steps
        fig["step_s"] = parts.runner.profiled_wall / n
    fig["ops"] = [[row["name"], row["phase"], row["category"], row["time_s"] / n]
                  for row in prof.ops()]
    return fig


def gather_figures(parts: RunParts) -> list[dict[str, Any]] | None:
    """Every rank's figures at rank 0, in rank order (a collective: every rank calls it);
    None on the other ranks and in a single process."""
    if parts.comm is None:
        return None
    return parts.comm.mpi_comm.gather(rank_figures(parts), root=0)


def throughput(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record's `parallel.ranks`: each rank's training time, steps and tokens/s."""
    return [{k: f.get(k) for k in ("rank", "steps_time_s", "timed_steps", "tokens_per_s")}
            for f in figures]


def spread(figures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The record's `profile.ranks`: each op's seconds per step as min / median / max over
    the ranks that profiled it (longest median first), and the slowest rank's step time
    against the median step; None unless at least two ranks profiled."""
    profiled = [f for f in figures if "ops" in f]
    if len(profiled) < 2:
        return None
    times: dict[tuple[str, str, str], list[float]] = {}
    for f in profiled:
        for name, phase, category, secs in f["ops"]:
            times.setdefault((name, phase, category), []).append(secs)
    ops = [{"name": name, "phase": phase, "category": category, "min_s": min(v),
            "median_s": statistics.median(v), "max_s": max(v), "ranks": len(v)}
           for (name, phase, category), v in times.items()]
    slowest = max(profiled, key=lambda f: f["step_s"])
    out: dict[str, Any] = {
        "count": len(profiled),
        "ops": sorted(ops, key=lambda o: -o["median_s"]),
        "step_s": [f["step_s"] for f in profiled],
        "straggler": {"rank": slowest["rank"], "step_s": slowest["step_s"],
                      "median_step_s": statistics.median(f["step_s"] for f in profiled)},
    }
    if all("busy_s" in f for f in profiled):
        # each rank's own check: its ops' sum against its device-busy time (the sum is
        # larger by what its two streams ran at once)
        out["busy_s"] = [f["busy_s"] for f in profiled]
        out["ops_sum_s"] = [sum(op[3] for op in f["ops"]) for f in profiled]
    if all("compute_s" in f for f in profiled):
        out["compute_s"] = [f["compute_s"] for f in profiled]
        out["exposed_s"] = [f["exposed_s"] for f in profiled]
        out["comm_s"] = [f["comm_s"] for f in profiled]
        out["straggler"]["compute_s"] = slowest["compute_s"]
        out["straggler"]["median_compute_s"] = statistics.median(out["compute_s"])
    return out
