"""`rustyflow bench`'s results as markdown: the table, the crossover and Amdahl's view.

A sweep (see ``training.bench.sweep``) is ``{"vocab", "seconds", "devices": {"cpu": {...},
"gpu": {"usable", "reason" | "name", "describe"}}, "rows": [...]}``; each row has the point's
shape, ``params``, ``flops_per_step`` (the step's matmul FLOPs), a ``cpu`` and (when the GPU
is usable) a ``gpu`` cell with ``ms_per_step``, ``tokens_per_s``, ``matmul_share`` (or
``error``), and ``speedup`` = GPU tokens/s ÷ CPU tokens/s.
"""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]


def _gflop(row: Row) -> str:
    return f"{row['flops_per_step'] / 1e9:,.3g}"


def _shape(row: Row) -> str:
    return f"L{row['layers']} E{row['embed']} H{row['heads']}"


def _layout(row: Row) -> str:
    return f"{row['batch']} × {row['seq_len']}"


def _cells(cell: Any) -> list[str]:
    if "error" in cell:
        return [cell["error"], "", ""]
    return [f"{cell['ms_per_step']:,.2f}", f"{cell['tokens_per_s']:,.0f}",
            f"{100 * cell['matmul_share']:.0f}"]


def table(sweep: dict[str, Any]) -> list[str]:
    """One markdown row per grid point; without a usable GPU its columns become one that
    says why."""
    gpu = sweep["devices"]["gpu"]
    head = "| Model | Batch × seq | Params | GFLOP/step | CPU ms/step | CPU tok/s | CPU matmul % |"
    rule = "|---|---|---:|---:|---:|---:|---:|"
    if gpu.get("usable"):
        head += " GPU ms/step | GPU tok/s | GPU matmul % | GPU/CPU |"
        rule += "---:|---:|---:|---:|"
    else:
        head, rule = head + " GPU |", rule + "---|"
    lines = [head, rule]
    for row in sweep["rows"]:
        cells = [_shape(row), _layout(row), f"{row.get('params', 0):,}", _gflop(row),
                 *_cells(row["cpu"])]
        if gpu.get("usable"):
            speedup = f"{row['speedup']:,.2f}x" if row.get("speedup") else "n/a"
            cells += [*_cells(row["gpu"]), speedup]
        else:
            cells.append(f"not usable: {gpu.get('reason')}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def crossover(rows: list[Row]) -> str:
    """Where the GPU starts to win: the smallest work per step (matmul FLOPs) with a speed-up
    above 1, and whether every larger point of the grid is a win too."""
    measured = sorted((r for r in rows if r.get("speedup")), key=lambda r: r["flops_per_step"])
    if not measured:
        return "No crossover: the GPU was not measured."
    wins = [r for r in measured if r["speedup"] > 1]
    if not wins:
        best = max(measured, key=lambda r: r["speedup"])
        return (f"The GPU wins nowhere on this grid: its best is {best['speedup']:.2f}x at "
                f"{_gflop(best)} GFLOP/step ({_shape(best)}, {_layout(best)}).")
    first = wins[0]
    where = f"{_gflop(first)} GFLOP/step ({_shape(first)}, batch × seq {_layout(first)})"
    if first is measured[0]:
        text = (f"The GPU wins at every point, down to the smallest step of the grid, {where}, "
                f"by {first['speedup']:.2f}x: the crossover lies below this grid.")
    else:
        below = measured[measured.index(first) - 1]
        text = (f"The GPU starts to win at {where}, by {first['speedup']:.2f}x; at the next "
                f"smaller step, {_gflop(below)} GFLOP/step ({_shape(below)}, "
                f"{_layout(below)}), the CPU is {1 / below['speedup']:.2f}x faster.")
    losses = [r for r in measured if r["flops_per_step"] > first["flops_per_step"]
              and r["speedup"] <= 1]
    if losses:
        text += " Above it the CPU still wins at " + ", ".join(
            f"{_gflop(r)} GFLOP/step ({_shape(r)}, {_layout(r)})" for r in losses) + "."
    return text


def amdahl(rows: list[Row]) -> list[str]:
    """The matmul share p on each side and Amdahl's bound 1/(1-p) on what faster matmuls
    alone could give, over the grid."""
    lines = []
    for kind, of in (("cpu", "of the step's wall time"), ("gpu", "of the device's busy time")):
        shares = [(r[kind]["matmul_share"], r) for r in rows
                  if isinstance(r.get(kind), dict) and "matmul_share" in r[kind]]
        if not shares:
            continue
        (lo, r_lo), (hi, r_hi) = min(shares, key=lambda s: s[0]), max(shares, key=lambda s: s[0])
        lines.append(
            f"- {kind.upper()}: matmul is {100 * lo:.0f}% ({_shape(r_lo)}, {_layout(r_lo)}) to "
            f"{100 * hi:.0f}% ({_shape(r_hi)}, {_layout(r_hi)}) {of}, so faster matmuls "
            f"alone could make the step at most {_bound(lo)} to {_bound(hi)} faster.")
    return lines


def _bound(p: float) -> str:
    return "unboundedly" if p >= 1 else f"{1 / (1 - p):.2f}x"


BENCH_TITLE = "# rustyflow bench: when does the GPU help?"  # bench.md's first line: its mark


def format_sweep(sweep: dict[str, Any], plot: str | None = None) -> str:
    """The sweep as a markdown document; `plot` names the picture next to it, if any."""
    devices = sweep["devices"]
    gpu = devices["gpu"]
    gpu_line = gpu["describe"] if gpu.get("usable") else f"not usable: {gpu.get('reason')}"
    lines = [
        BENCH_TITLE,
        "",
        f"- CPU: {devices['cpu']['describe']}",
        f"- GPU: {gpu_line}",
        f"- The product's training step (zero grad, forward, backward, clip, optimizer) on "
        f"random tokens, vocabulary {sweep['vocab']:,}, fp32: eager on the CPU, CUDA-graph "
        f"replay on the GPU. Step time over at least {sweep['seconds']:g}s of steps after "
        "warm-up; tokens/s = batch × seq ÷ step time; GFLOP/step counts the step's matmuls "
        "(forward and backward). Matmul % comes from a short profiled eager window.",
        "",
        *table(sweep),
        "",
        "## Crossover",
        "",
        crossover(sweep["rows"]),
        "",
        "## Amdahl's view",
        "",
        *(amdahl(sweep["rows"]) or ["No matmul shares were measured."]),
    ]
    if plot:
        lines += ["", f"![GPU/CPU speed-up against FLOPs per step]({plot})"]
    return "\n".join(lines) + "\n"
