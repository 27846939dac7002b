"""What the report computes from run records, as numbers: the average epoch time (measured or
estimated), the profile's window and its parts, and the comparisons between runs (CPU vs GPU,
data-parallel scaling). run_text, profile_tables and report_page lay them out as lines.

``[AVG_EPOCH_TIME]`` is the mean over completed epochs. When no epoch completed (an interrupted
run, or ``--max-steps`` shorter than an epoch) it is an estimate: the trainer's own
``avg_epoch_time_s`` if set, else ``steps_time_s / timed_steps * steps_per_epoch`` (the
training steps' own time: evaluation, checkpoint writes and start-up out), or in older
records ``(train_time_s - eval) / steps * steps_per_epoch``. A diverged run
(``no_extrapolation``) is never extrapolated. With nothing to estimate from, there is no
average.
"""

from __future__ import annotations

from .record_schema import Record, device_kind, is_num, model_shape, num, world_size
from .text import one_line, plural


def epoch_time(r: Record) -> tuple[float | None, str | None]:
    """The average epoch time to report, and why it is an estimate (None when measured)."""
    avg, epochs = r.get("avg_epoch_time_s"), num(r.get("epochs"))
    if is_num(avg):
        return float(avg), None if epochs >= 1 else "the trainer's estimate"
    if r.get("no_extrapolation"):
        return None, "not estimated from a diverged run"
    # this process's steps over this process's time (a resumed run ran only some of them)
    steps, per_epoch = r.get("steps_here", r.get("steps")), r.get("steps_per_epoch")
    train = r.get("train_time_s")
    if is_num(r.get("timed_steps")) and is_num(r.get("steps_time_s")):
        # evaluation and start-up already out (records since the graph profile)
        steps, step_s = r["timed_steps"], float(r["steps_time_s"])
        excluded = "evaluation and start-up excluded"
    else:
        prof = r.get("profile") if isinstance(r.get("profile"), dict) else {}
        step_s = max(num(train) - num((prof.get("phases") or {}).get("eval")), 0.0)
        excluded = "evaluation excluded"
    if is_num(steps) and is_num(per_epoch) and is_num(train) and steps > 0 and per_epoch > 0:
        note = (f"{plural(steps, 'step')} in {step_s:.3f}s ({excluded}) scaled to "
                f"{per_epoch:,} steps/epoch")
        return step_s / steps * per_epoch, note
    return None, "nothing to extrapolate from"


def profile_window(prof: Record) -> tuple[list[Record], float]:
    """The profile's ops and the window their shares are of: the profiled steps' time, or
    the sum of the op times where a profile lacks it."""
    ops = [op for op in prof.get("ops") or [] if isinstance(op, dict)]
    window = prof.get("profiled_time_s")
    if not (is_num(window) and window > 0):
        window = sum(num(op.get("time_s")) for op in ops)
    return ops, window


def replays_per_step(prof: Record) -> int | None:
    """A graph profile's sampled replays (its table is per step); None for the others."""
    s = prof.get("sampling") if isinstance(prof.get("sampling"), dict) else {}
    n = s.get("replays")
    return int(n) if prof.get("timing") == "cupti-graph" and is_num(n) and n > 0 else None


def idle_time(prof: Record) -> float | None:
    """Seconds the replayed steps' device was idle between kernels (a row of its own, so
    the table adds up to the step's device time)."""
    s = prof.get("sampling") if isinstance(prof.get("sampling"), dict) else {}
    span, busy = s.get("span_s"), s.get("busy_s")
    return max(span - busy, 0.0) if is_num(span) and is_num(busy) else None


def category_time(ops: list[Record], category: str) -> float:
    return sum(num(op.get("time_s")) for op in ops if op.get("category") == category)


def speedups(records: list[Record]) -> list[Record]:
    """CPU vs GPU for each dataset and model shape: the latest completed run of each device.
    One-process runs only: several GPUs against one CPU process is not a device comparison
    (:func:`scaling` compares process counts)."""
    groups: dict[tuple[str, str], dict[str, Record]] = {}
    for r in records:
        kind = device_kind(r)
        if r.get("status") == "completed" and kind in ("cpu", "gpu") and world_size(r) == 1:
            key = (one_line(r.get("dataset")), model_shape(r))
            groups.setdefault(key, {})[kind] = r
    out = []
    for (dataset, shape), runs in groups.items():
        if "cpu" not in runs or "gpu" not in runs:
            continue
        cpu, gpu = runs["cpu"], runs["gpu"]
        cpu_epoch, gpu_epoch = epoch_time(cpu)[0], epoch_time(gpu)[0]
        cpu_tok, gpu_tok = cpu.get("tokens_per_s"), gpu.get("tokens_per_s")
        out.append(
            {
                "dataset": dataset,
                "shape": shape,
                "cpu_run": cpu.get("timestamp"),
                "gpu_run": gpu.get("timestamp"),
                "cpu_precision": cpu.get("precision"),
                "gpu_precision": gpu.get("precision"),
                "cpu_avg_epoch_s": cpu_epoch,
                "gpu_avg_epoch_s": gpu_epoch,
                "epoch_speedup": cpu_epoch / gpu_epoch if cpu_epoch and gpu_epoch else None,
                "cpu_tokens_per_s": cpu_tok,
                "gpu_tokens_per_s": gpu_tok,
                "tokens_per_s_ratio": (
                    gpu_tok / cpu_tok
                    if is_num(cpu_tok) and is_num(gpu_tok) and cpu_tok > 0
                    else None
                ),
            }
        )
    return out


def scaling(records: list[Record]) -> list[Record]:
    """Data-parallel scaling on GPUs: for each dataset, model shape (per-process BATCH_SIZE
    included) and precision, the latest completed run of each process count N > 1 against the
    latest completed one-process run. Everything else that sets tokens/s is held fixed, so the
    speed-up is the processes' alone, and efficiency = speed-up / N (1.0 is linear scaling)."""
    groups: dict[tuple[str, str, str], dict[int, Record]] = {}
    for r in records:
        tok = r.get("tokens_per_s")
        if r.get("status") == "completed" and device_kind(r) == "gpu" and is_num(tok) and tok > 0:
            key = (one_line(r.get("dataset")), model_shape(r), one_line(r.get("precision")))
            groups.setdefault(key, {})[world_size(r)] = r
    out = []
    for (dataset, shape, precision), runs in groups.items():
        one = runs.get(1)
        if one is None:
            continue
        for n in sorted(k for k in runs if k > 1):
            run = runs[n]
            speedup = run["tokens_per_s"] / one["tokens_per_s"]
            out.append(
                {
                    "dataset": dataset,
                    "shape": shape,
                    "precision": precision,
                    "world_size": n,
                    "one_process_run": one.get("timestamp"),
                    "run": run.get("timestamp"),
                    "one_process_tokens_per_s": one["tokens_per_s"],
                    "tokens_per_s": run["tokens_per_s"],
                    "speedup": speedup,
                    "efficiency": speedup / n,
                }
            )
    return out
