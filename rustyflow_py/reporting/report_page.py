"""``rustyflow report``: the runs of the logs as a table, the CPU-vs-GPU speed-ups, the
data-parallel scaling, the latest run's loss curve and its profiling block, as aligned text,
markdown or JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Literal

from .analysis import epoch_time, scaling, speedups
from .curves import curve, sparkline
from .log_writer import format_block, plain
from .record_schema import JSON_TAG, Record, model_shape, world_size
from .run_text import ppl_text
from .text import fold, markdown, number, one_line, table


def _human_block(r: Record) -> str:
    """The run's block as the log holds it, less the [RUN_JSON] line no person reads."""
    return "\n".join(ln for ln in format_block(r).split("\n") if not ln.startswith(JSON_TAG))


def _run_row(r: Record) -> list[str]:
    used, requested = one_line(r.get("device")), r.get("device_requested")
    if world_size(r) > 1:
        used += f" x{world_size(r)}"
    if r.get("fallback_reason") or requested not in (None, "auto", r.get("device")):
        used += f" (req {one_line(requested)})"
    avg, estimate = epoch_time(r)
    return [
        one_line(r.get("timestamp")),
        one_line(r.get("status")),
        used,
        one_line(r.get("hardware")),
        one_line(r.get("dataset")),
        model_shape(r),
        one_line(r.get("precision")),
        f"{one_line(r.get('epochs'))}/{one_line(r.get('epochs_planned'))}",
        ("~" if estimate and avg is not None else "") + number(avg, ".3f"),
        number(r.get("tokens_per_s"), ",.0f"),
        ppl_text(r, "val"),
        ppl_text(r, "test"),
    ]


_RUN_HEADERS = (
    "Timestamp,Status,Device,Hardware,Dataset,Shape,Precision,Epochs,Avg epoch s,Tok/s,Val ppl,"
    "Test ppl"
).split(",")
_SPEEDUP_HEADERS = (
    "Dataset,Shape,CPU run,GPU run,CPU epoch s,GPU epoch s,Speed-up,CPU tok/s,GPU tok/s,Tok/s ratio"
).split(",")
_SCALING_HEADERS = (
    "Dataset,Shape,Precision,Processes,1-process run,N-process run,Tok/s 1 process,"
    "Tok/s N processes,Speed-up,Efficiency"
).split(",")
_NO_SPEEDUP = (
    "none: needs a completed CPU run and a completed GPU run of the same dataset and model shape"
)


def _speedup_row(s: Record) -> list[str]:
    return [
        s["dataset"],
        s["shape"],
        f"{one_line(s['cpu_run'])} {one_line(s['cpu_precision'])}",
        f"{one_line(s['gpu_run'])} {one_line(s['gpu_precision'])}",
        number(s["cpu_avg_epoch_s"], ".3f"),
        number(s["gpu_avg_epoch_s"], ".3f"),
        number(s["epoch_speedup"], ".2f", "x"),
        number(s["cpu_tokens_per_s"], ",.0f"),
        number(s["gpu_tokens_per_s"], ",.0f"),
        number(s["tokens_per_s_ratio"], ".2f", "x"),
    ]


def _scaling_row(s: Record) -> list[str]:
    return [
        s["dataset"],
        s["shape"],
        s["precision"],
        str(s["world_size"]),
        one_line(s["one_process_run"]),
        one_line(s["run"]),
        number(s["one_process_tokens_per_s"], ",.0f"),
        number(s["tokens_per_s"], ",.0f"),
        number(s["speedup"], ".2f", "x"),
        number(100.0 * s["efficiency"], ".1f", "%"),
    ]


def _curve_lines(r: Record) -> list[str]:
    """A run's training loss (and validation perplexity) as terminal sparklines."""
    lines = []
    for name, label in (("loss", "training loss"), ("val_ppl", "validation ppl")):
        points = curve(r, name)
        if points:
            (s0, v0), (s1, v1) = points[0], points[-1]
            lines.append(f"{label:<15} {sparkline([v for _, v in points])}  {v0:.3f} at step "
                         f"{s0:,} -> {v1:.3f} at step {s1:,}")
    return lines


def terminal_width() -> int | None:
    """The width `report` fits its table text to: the terminal's, or COLUMNS when the output
    goes to a pipe or file and COLUMNS is set; else None (whole lines, for grep and files)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return max(shutil.get_terminal_size((100, 24)).columns, 40)
    return None


def render_report(
    records: list[Record],
    fmt: Literal["table", "markdown", "json"] = "table",
    last: int | None = None,
    width: int | None = None,
) -> str:
    """The ``rustyflow report`` output: runs, CPU-vs-GPU speed-ups, data-parallel scaling, the
    latest run's report. With a `width`, the table format fits it: wide tables fold their
    columns and long lines wrap (markdown and JSON are for files, and stay whole).

    ``last`` keeps only the last N runs of the log, and everything (speed-ups and the latest
    report included) is computed over those. The report shown is the latest run's that has a
    profile (an early-interrupted run has none), else the latest run's. The scaling section
    (json: ``scaling``) is left out when no pair of runs gives one, so a log without
    data-parallel runs reports as it did before they existed.
    """
    if last is not None:
        if last < 1:
            raise ValueError(f"last must be at least 1, got {last}")
        records = records[-last:]
    pairs_found, scaled = speedups(records), scaling(records)
    profiled = [r for r in records if isinstance(r.get("profile"), dict)]
    latest = (profiled or records or [None])[-1]
    if fmt == "json":
        doc = {"runs": records, "speedups": pairs_found,
               **({"scaling": scaled} if scaled else {}), "latest": latest}
        return json.dumps(plain(doc), indent=2, allow_nan=False) + "\n"
    if fmt not in ("table", "markdown"):
        raise ValueError(f"unknown report format {fmt!r}: expected table, markdown or json")
    md = fmt == "markdown"
    width = None if md else width

    def layout(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
        return markdown(headers, rows, right) if md else table(headers, rows, right, width)

    out: list[str] = []

    def section(title: str, lines: list[str]) -> None:
        lines = ([f"## {title}", ""] if md else [title]) + lines
        if width is not None:  # a block's lines are one string: each line folds on its own
            lines = [f for text in lines for ln in text.split("\n") for f in fold(ln, width)]
        out.extend(([""] if out else []) + lines)

    runs = [_run_row(r) for r in records]
    run_lines = layout(_RUN_HEADERS, runs, {7, 8, 9, 10, 11}) if runs else ["No runs in the log."]
    if any(row[8].startswith("~") for row in runs):
        run_lines.append("~ estimated: no epoch completed (see that run's block)")
    section(f"Runs ({len(runs)})", run_lines)
    pairs = [_speedup_row(s) for s in pairs_found]
    section(
        "CPU vs GPU speed-up (latest completed run of each, same dataset and shape)",
        layout(_SPEEDUP_HEADERS, pairs, {4, 5, 6, 7, 8, 9}) if pairs else [_NO_SPEEDUP],
    )
    if scaled:
        section(
            "Data-parallel scaling (GPU; latest completed run of each process count vs the latest "
            "1-process run, same dataset, shape and precision)",
            layout(_SCALING_HEADERS, [_scaling_row(s) for s in scaled], {3, 6, 7, 8, 9}),
        )
    curved = [r for r in records if curve(r, "loss")]
    if curved:
        r = curved[-1]
        lines = _curve_lines(r)
        section(f"Loss curve: run {one_line(r.get('timestamp'))} ({one_line(r.get('device'))}, "
                f"{model_shape(r)})", ["```text", *lines, "```"] if md else lines)
    if latest is not None:
        body = _human_block(latest).rstrip("\n")
        title = f"Latest profiling report: run {one_line(latest.get('timestamp'))}"
        section(title, ["```text", body, "```"] if md else [body])
    return "\n".join(out) + "\n"
