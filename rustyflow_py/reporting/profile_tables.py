"""The profile part of the log block: the per-op table, the matmul / communication / other
split with Amdahl's bound, the phases, host<->device traffic, memory and the CPU matmul floor.

Shares. The per-op and matmul/other shares are of the profiled training steps: the denominator
is ``profile.profiled_time_s`` (the sum of the op times if it is missing), and the matmul line
names it. On the CPU that is the wall time of every step (the run's training time less
evaluation). On the GPU it is the device time of the sampled CUDA-graph replays (``timing``
``cupti-graph``: the table is then per step, in milliseconds, with an ``(idle between
kernels)`` row so the shares add up to the replayed step), or the wall time of an eager window
(``cuda-events``, ``PROFILE_MODE=eager`` or no CUPTI), which the profile's first line says.
The matmul share p = matmul op time / window, "Other" = window - matmul (non-matmul ops, data
loading and framework overhead), Amdahl's bound = 1 / (1 - p). Evaluation and checkpoint writes
run outside the training steps: their phase shares are of the run's ``train_time_s``.

Data parallelism. Collectives are ops of category ``comm``: their time gets its own line, and
"Other" = window - matmul - comm. On the GPU they are timed on the step's stream in the
profiled window; in the replayed steps the gradient all-reduce overlaps backward on a second
stream, so less of it is exposed there. Amdahl's bound stays the matmul one. Without ``comm``
ops the lines are exactly those above.
"""

from __future__ import annotations

from typing import Any

from . import comm_text, profile_text
from .analysis import category_time, idle_time, profile_window, replays_per_step
from .record_schema import Record, device_kind, is_num, num
from .text import NA, byte_size, number, one_line, pct, plural, share, table


def op_table(ops: list[Record], window: float, idle: float | None = None,
             per_step: int | None = None) -> list[str]:
    """The per-op table, longest first, with its shares of `window`; `idle` (a graph profile's
    device time between kernels) gets a row of its own before the total. With `per_step` (a
    graph profile's sampled replays) calls and times are per step, in milliseconds."""
    n = per_step or 1
    time_text = (lambda secs: f"{secs * 1e3 / n:.3f}") if per_step else (lambda secs: f"{secs:.3f}")
    rows = []
    for op in sorted(ops, key=lambda op: -num(op.get("time_s"))):
        calls, secs = op.get("calls"), num(op.get("time_s"))
        per_call = secs * 1e3 / calls if is_num(calls) and calls > 0 else None
        rows.append(
            [
                one_line(op.get("name")),
                one_line(op.get("phase")),
                one_line(op.get("category")),
                (number(calls / n if is_num(calls) else None, ",.4g") if per_step
                 else number(calls, ",")),
                time_text(secs),
                number(per_call, ".3f"),
                share(secs, window),
            ]
        )
    total = sum(num(op.get("time_s")) for op in ops)
    calls = sum(int(num(op.get("calls"))) for op in ops)
    if idle is not None:
        rows.append(["(idle between kernels)", "", "", "", time_text(idle), "",
                     share(idle, window)])
        total += idle
    rows.append(["all ops", "", "", f"{calls / n:,.4g}" if per_step else f"{calls:,}",
                 time_text(total), "", share(total, window)])
    headers = ["Op", "Phase", "Category", "Calls/step" if per_step else "Calls",
               "ms/step" if per_step else "Total s", "ms/call", "Share %"]
    return table(headers, rows, right={3, 4, 5, 6})


_COMM_GPU = ("Communication time (NCCL collectives, measured on the step's stream in the "
             "profiled steps; they overlap backward in replayed steps)")
_COMM_GRAPH = ("Communication time (NCCL kernels of the replayed step, overlapping compute: "
               "see the communication lines)")
_COMM_CPU = ("Communication time (collectives over sockets between the processes, host wall time, "
             "waits for the other processes included)")


def matmul_lines(
    ops: list[Record], window: float, profiled: int, steps: int, note: Any, gpu: bool,
    per_step: int | None = None,
) -> list[str]:
    """Matmul, communication (data-parallel runs only) and the rest of the window, and the
    matmul Amdahl bound. Other excludes the collectives so the three shares add up. With
    `per_step` (a graph profile's sampled replays) the times are milliseconds per step."""
    matmul, comm = category_time(ops, "matmul"), category_time(ops, "comm")
    has_comm = any(op.get("category") == "comm" for op in ops)
    other = max(window - matmul - comm, 0.0)
    p = min(matmul / window, 1.0) if window > 0 else None
    if p is None:
        bound = NA
    else:
        bound = "unbounded" if p >= 1.0 else f"{1.0 / (1.0 - p):.2f}x"
    if per_step:
        def amount(secs: float) -> str:
            return f"{secs * 1e3 / per_step:.3f} ms/step"
        whole = f"{window * 1e3 / per_step:.3f} ms replayed step on the device"
    else:
        def amount(secs: float) -> str:
            return f"{secs:.3f}s"
        whole = f"{window:.3f}s of profiled training steps{' on the device' if gpu else ''}"
    lines = [
        f"Total matmul time (CPU + GPU): {amount(matmul)} ({pct(matmul, window)} of the "
        f"{whole})",
    ]
    if has_comm:
        label = (_COMM_GRAPH if per_step else _COMM_GPU) if gpu else _COMM_CPU
        lines.append(f"{label}: {amount(comm)} ({pct(comm, window)} of the same)")
    excluded = "communication and eval" if has_comm else "eval"
    lines += [
        f"Other time (non-matmul ops, data loading and framework overhead; {excluded} "
        f"excluded): {amount(other)} ({pct(other, window)} of the same)",
        f"Amdahl's bound: {bound} max speed-up from faster matmuls alone (p={number(p, '.3f')})",
    ]
    if profiled < steps and per_step:
        lines.append(f"Per-op numbers and shares come from {plural(profiled, 'sampled replay')}"
                     f" of the {steps:,} training steps, all replays of one captured step")
    elif profiled < steps:
        lines.append(
            f"Per-op numbers and shares come from the profiled window ({profiled:,} of "
            f"{steps:,} steps, {window:.3f}s), not the whole run: {one_line(note)}"
        )
    return lines


_PHASES = ("forward", "backward", "optimizer", "data")


def _phase_lines(r: Record, prof: Record, window: float) -> list[str]:
    phases = prof.get("phases") or {}
    rows = [
        [
            name,
            number(phases.get(name), ".3f"),
            share(num(phases.get(name)), window),
            "profiled window",
        ]
        for name in _PHASES
    ]
    train = num(r.get("train_time_s"))
    for aside in ("eval", "checkpoint"):  # outside the steps: shares of the run's time
        if aside in phases:
            value = phases.get(aside)
            rows.append([aside, number(value, ".3f"), share(num(value), train), "training time"])
    lines = ["Phase split", *table(["Phase", "Time s", "Share %", "Of"], rows, right={1, 2})]
    host, busy = prof.get("host_launch_s"), prof.get("device_busy_s")
    if host is not None:  # an eager window: the host launching against the device working
        lines.append(
            f"GPU host vs device: host launching {number(host, '.3f', 's')}, device busy "
            f"{number(busy, '.3f', 's')} ({pct(num(busy), window)} of the {window:.3f}s window)"
        )
    return lines


def _traffic_lines(prof: Record) -> list[str]:
    t = prof.get("transfers")
    if not isinstance(t, dict):
        return []
    n = t.get("steps") if is_num(t.get("steps")) else 0
    per, total = [], []
    for kind in ("h2d", "d2h"):
        count, size = t.get(f"{kind}_count"), t.get(f"{kind}_bytes")
        total.append(f"{kind.upper()} {number(count, ',')} copies ({byte_size(size)})")
        if n > 0 and is_num(count) and is_num(size):
            per.append(f"{kind.upper()} {count / n:.2f} copies ({byte_size(size / n)})")
        else:
            per.append(f"{kind.upper()} {NA}")
    return [
        f"Host<->device traffic per step: {', '.join(per)}",
        f"Host<->device traffic over {plural(n, 'step')}: {', '.join(total)}",
    ]


def _memory_lines(prof: Record) -> list[str]:
    m = prof.get("memory")
    if not isinstance(m, dict):
        return []
    if m.get("kind") == "gpu_pool":
        return [
            f"Memory: peak GPU pool used {byte_size(m.get('peak_bytes'))} of "
            f"{byte_size(m.get('pool_total_bytes'))} pool total"
        ]
    return [f"Memory: peak process RSS {byte_size(m.get('peak_bytes'))}"]


def _floor_lines(prof: Record) -> list[str]:
    f = prof.get("matmul_floor")
    if not isinstance(f, dict):
        return []
    floor, step = f.get("floor_s_per_step"), f.get("step_s")
    ok = is_num(floor) and is_num(step) and floor > 0
    ratio = f"{step / floor:.2f}x the floor" if ok else NA
    if ok and step < floor:  # a floor the steps beat was measured on a busy machine
        ratio = (f"{step / floor:.2f}x: faster than this floor, whose GEMM rate was measured "
                 "while other work slowed it; no bound here")
    floor_ms = number(floor * 1e3 if is_num(floor) else None, ".3f")
    step_ms = number(step * 1e3 if is_num(step) else None, ".3f")
    return [
        f"Matmul floor: {floor_ms} ms/step at {number(f.get('gflops'), '.1f')} GFLOP/s measured "
        f"GEMM rate vs {step_ms} ms/step real ({ratio})"
    ]


def profile_lines(r: Record) -> list[str]:
    prof = r.get("profile")
    if not isinstance(prof, dict):
        return ["Profile: none (profiling was off, or the run ended before a profiled step)"]
    ops, window = profile_window(prof)
    steps, profiled = int(num(r.get("steps"))), int(num(prof.get("profiled_steps")))
    graph = prof.get("timing") == "cupti-graph"
    what = "device time" if graph or device_kind(r) == "gpu" else "wall"
    head = (
        f"Per-op profile ({one_line(prof.get('timing'))}): {one_line(prof.get('note'))}; "
        f"{profiled:,} of {steps:,} steps profiled"
        + ("" if graph else f", {window:.3f}s {what}")
    )
    idle = idle_time(prof) if graph else None
    per_step = replays_per_step(prof)
    return [
        head,
        *op_table(ops, window, idle, per_step),
        *matmul_lines(ops, window, profiled, steps, prof.get("note"), device_kind(r) == "gpu",
                      per_step),
        *profile_text.graph_lines(prof, r.get("train_time_s")),
        *comm_text.comm_lines(prof),
        *comm_text.rank_lines(prof),
        "",
        *_phase_lines(r, prof, window),
        "",
        *profile_text.kernel_lines(r),
        *profile_text.roofline_lines(r),
        *_traffic_lines(prof),
        *_memory_lines(prof),
        *_floor_lines(prof),
    ]
