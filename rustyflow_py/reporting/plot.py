"""`rustyflow plot`: pictures of the runs in the log, as PNG and SVG files.

Three pictures, each drawn only when the selected runs have what it needs:

- ``loss-curves``: training loss, validation perplexity and learning rate against the step,
  the selected runs overlaid (from the records' curves; older records have none);
- ``op-breakdown``: where a run's profiled step time goes, by phase (forward, backward,
  optimizer) split into matmul and other, and its most expensive ops;
- ``cpu-vs-gpu``: epoch time and tokens/s of the CPU and GPU runs of the same model (the pairs
  ``rustyflow report`` compares).

matplotlib is an optional extra, imported only here and only when a picture is drawn, on the
Agg backend (files only: no display is needed or opened).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RustyFlowError, command, install_command
from .analysis import speedups
from .curves import curve
from .profile_text import roofline
from .record_schema import Record

FORMATS = ("png", "svg")
PHASES = ("forward", "backward", "optimizer")
COLORS = {"cpu": "tab:blue", "gpu": "tab:green", "matmul": "tab:orange", "other": "tab:gray"}
TOP_OPS = 12


class PlotError(RustyFlowError):
    """A picture cannot be drawn (matplotlib missing, no run selected)."""


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; PlotError saying how to install it if missing."""
    try:
        import matplotlib
    except ImportError:
        raise PlotError("matplotlib is not installed, and pictures need it: "
                        f"{install_command('plot')}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "rustyflow"  # the same run draws the same SVG
    return plt


def select(records: list[Record], last: int | None = None,
           runs: Sequence[str] = ()) -> list[Record]:
    """The runs named by timestamp (`runs`), else the last `last` runs, else all of them."""
    if runs:
        stamps = {r.get("timestamp") for r in records}
        unknown = [t for t in runs if t not in stamps]
        if unknown:
            raise PlotError(f"no run with timestamp {', '.join(unknown)} in the log (see "
                            f"`{command()} report` for the runs' timestamps)")
        return [r for r in records if r.get("timestamp") in runs]
    return records[-last:] if last else records


def plot_runs(records: list[Record], folder: str | Path,
              formats: Sequence[str] = FORMATS) -> tuple[list[Path], list[str]]:
    """Draw every picture the `records` allow into `folder`: (files written, why a picture
    was left out)."""
    plt = pyplot()
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    for stem, draw in (("loss-curves", _curves), ("op-breakdown", _ops),
                       ("roofline", _roofline), ("cpu-vs-gpu", _cpu_vs_gpu)):
        fig_or_reason = draw(plt, records)
        if isinstance(fig_or_reason, str):
            skipped.append(f"{stem}: {fig_or_reason}")
        else:
            written += save(plt, fig_or_reason, out / stem, formats)
    return written, skipped


MARK = "rustyflow plot"  # in every picture's metadata: what may be drawn over


def _is_ours(path: Path) -> bool:
    """A picture rustyflow drew: its mark sits in the PNG text chunks or the SVG metadata,
    both before the image data."""
    with open(path, "rb") as f:
        return MARK.encode() in f.read(1 << 14)


def save(plt: Any, fig: Any, stem: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """`fig` as stem.png, stem.svg, ...; closed afterwards."""
    paths = []
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        if path.is_file() and not _is_ours(path):
            plt.close(fig)
            raise PlotError(f"{path} exists and was not drawn by rustyflow: it is not "
                            f"overwritten; move it away, or pass --out another folder")
        mark = {"Software": MARK} if fmt == "png" else {"Date": None, "Creator": MARK}
        fig.savefig(path, dpi=100, metadata=mark)
        paths.append(path)
    plt.close(fig)
    return paths


def label(r: Record) -> str:
    """A run's legend entry: when, where and what shape."""
    m = r.get("model") if isinstance(r.get("model"), dict) else {}
    shape = " ".join(f"{tag}{m.get(key, '?')}" for tag, key in
                     (("L", "layers"), ("E", "embed"), ("B", "batch"), ("T", "seq_len")))
    return f"{str(r.get('timestamp', '?'))[:16]} {r.get('device', '?')} {shape}"


def _curves(plt: Any, records: list[Record]) -> Any:
    runs = [r for r in records if curve(r, "loss")]
    if not runs:
        return "no selected run has curves (runs logged before curves were recorded have none)"
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), layout="constrained")
    panels = (("loss", "training loss"), ("val_ppl", "validation perplexity"),
              ("lr", "learning rate"))
    for ax, (name, title) in zip(axes, panels, strict=True):
        for r in runs:
            points = curve(r, name)
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, marker="o" if name == "val_ppl" else None,
                        markersize=4, linewidth=1.2, label=label(r))
        ax.set(title=title, xlabel="step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return fig


def _latest_profiled(records: list[Record], *fields: str) -> Record | None:
    """The last of `records` whose profile has every one of `fields` (non-empty)."""
    return next((r for r in reversed(records) if isinstance(r.get("profile"), dict)
                 and all(r["profile"].get(f) for f in fields)), None)


def _ops(plt: Any, records: list[Record]) -> Any:
    r = _latest_profiled(records, "ops", "profiled_steps")
    if r is None:
        return "no selected run has a per-op profile"
    prof = r["profile"]
    steps = prof["profiled_steps"]

    def ms(op: Record) -> float:  # per step; a non-finite time was logged as null
        return (op.get("time_s") or 0.0) * 1e3 / steps

    by_phase: dict[tuple[str, str], float] = defaultdict(float)
    for op in prof["ops"]:
        by_phase[(op.get("phase"), op.get("category"))] += ms(op)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained",
                                      width_ratios=(1, 1.6))
    bottom = [0.0] * len(PHASES)
    for category in ("matmul", "other"):
        heights = [by_phase[(phase, category)] for phase in PHASES]
        left.bar(PHASES, heights, bottom=bottom, color=COLORS[category], label=category)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    left.set(title="per phase", ylabel="ms per step")
    left.legend()
    top = sorted(prof["ops"], key=lambda op: -ms(op))[:TOP_OPS][::-1]
    right.barh([f"{op.get('name')} ({op.get('phase')})" for op in top], [ms(op) for op in top],
               color=[COLORS.get(op.get("category"), "tab:gray") for op in top])
    right.set(title=f"top {len(top)} ops", xlabel="ms per step")
    right.tick_params(axis="y", labelsize=8)
    timing = {"cuda-events": "device time, CUDA events of an eager window",
              "cupti-graph": "device time of sampled CUDA-graph replays"}.get(
                  str(prof.get("timing")), "wall time")
    fig.suptitle(f"{label(r)} ({r.get('hardware', '?')}): {steps:,} profiled steps, {timing}",
                 fontsize=10)
    return fig


def _roofline(plt: Any, records: list[Record]) -> Any:
    """The latest profiled run's ops against the device's limits, each a point sized by its
    time: GEMM ops by arithmetic intensity and TFLOP/s under the compute and memory roofs,
    the other ops by bytes and GB/s under the bandwidth."""
    r = _latest_profiled(records, "peaks", "ops")
    if r is None:
        return "no selected run has a profile with the device's peaks (older runs have none)"
    prof = r["profile"]
    rows = roofline(prof["ops"], prof["peaks"], str(r.get("precision", "fp32")),
                    int(prof.get("profiled_steps") or 1))
    if not rows:
        return "the latest profiled run has no op with counted work"
    peaks = prof["peaks"]
    fig, (gemm, memory) = plt.subplots(1, 2, figsize=(13, 4.6), layout="constrained")
    biggest = max(row["ms_per_step"] for row in rows)
    for ax, kind in ((gemm, "GEMM"), (memory, "memory")):
        points = [row for row in rows if row["kind"].startswith(kind)]
        if not points:
            ax.set_axis_off()
            continue
        points = [row for row in points if kind != "GEMM" or row["intensity"]]
        x = [row["intensity"] if kind == "GEMM" else row["bytes_per_step"] for row in points]
        y = [row["rate"] for row in points]
        size = [20 + 600 * row["ms_per_step"] / biggest for row in points]
        ax.scatter(x, y, s=size, alpha=0.6, color=COLORS["matmul" if kind == "GEMM" else
                                                          "other"])
        for row, xi, yi in zip(points[:8], x, y, strict=False):
            ax.annotate(f"{row['name']} ({row['phase'][:3]})", (xi, yi), fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    _roofs(gemm, peaks, rows)
    if peaks.get("bandwidth_gbs"):
        memory.axhline(peaks["bandwidth_gbs"], color="tab:red", linewidth=1,
                       label=f"bandwidth {peaks['bandwidth_gbs']:,.0f} GB/s")
        memory.legend(fontsize=8)
    gemm.set(title="GEMM ops", xlabel="FLOP per byte (arrays at the op boundary)",
             ylabel="achieved TFLOP/s")
    memory.set(title="other ops", xlabel="bytes per step", ylabel="GB/s (bytes estimated)")
    fig.suptitle(f"Roofline: {label(r)} ({r.get('hardware', '?')}), point size = time per "
                 f"step; peaks: {peaks.get('source', '?')}", fontsize=10)
    return fig


def _roofs(ax: Any, peaks: dict[str, Any], rows: list[Record]) -> None:
    """Each GEMM kind's roof: min(peak, bandwidth x intensity)."""
    kinds = sorted({row["kind"].split()[1] for row in rows if row["kind"].startswith("GEMM")})
    bandwidth = peaks.get("bandwidth_gbs")
    x = np.geomspace(0.1, 1e4, 200)
    for kind in kinds:
        peak = (peaks.get("tflops") or {}).get(kind)
        if peak:
            y = np.minimum(peak, bandwidth * x / 1e3) if bandwidth else np.full_like(x, peak)
            ax.plot(x, y, linewidth=1, label=f"{kind} roof, {peak:,.0f} TFLOP/s")
    if kinds:
        ax.legend(fontsize=8)


def _cpu_vs_gpu(plt: Any, records: list[Record]) -> Any:
    pairs = [s for s in speedups(records)
             if s["cpu_avg_epoch_s"] and s["gpu_avg_epoch_s"] and s["cpu_tokens_per_s"]
             and s["gpu_tokens_per_s"]]
    if not pairs:
        return ("no completed CPU run and GPU run of the same dataset and model shape among "
                "the selected runs")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    width = 0.38
    xs = range(len(pairs))
    panels = (("avg_epoch_s", "average epoch time (s), lower is better", "epoch_speedup"),
              ("tokens_per_s", "training tokens/s, higher is better", "tokens_per_s_ratio"))
    for ax, (field, title, ratio) in zip(axes, panels, strict=True):
        for shift, device in ((-width / 2, "cpu"), (width / 2, "gpu")):
            values = [s[f"{device}_{field}"] for s in pairs]
            bars = ax.bar([x + shift for x in xs], values, width, color=COLORS[device],
                          label=device.upper())
            ax.bar_label(bars, labels=[_number(v) for v in values], fontsize=8)
        names = [f"{s['dataset']} {s['shape']}\nGPU {_number(s[ratio])}x faster" for s in pairs]
        ax.set(title=title, yscale="log", xticks=list(xs), xticklabels=names)
        ax.legend()
    fig.suptitle("CPU vs GPU: the latest completed run of each, same dataset and model",
                 fontsize=10)
    return fig


def _number(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def plot_sweep(rows: list[dict[str, Any]], stem: str | Path,
               formats: Sequence[str] = FORMATS) -> list[Path]:
    """`rustyflow bench`'s picture: the GPU/CPU speed-up against the step's matmul FLOPs, one
    point per grid point, log-log, with the break-even line."""
    plt = pyplot()
    points = [(r["flops_per_step"], r["speedup"]) for r in rows if r.get("speedup")]
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    if points:
        flops, ratio = zip(*sorted(points), strict=True)
        ax.plot(flops, ratio, "o-", color=COLORS["gpu"])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="break-even")
    ax.set(xscale="log", yscale="log", xlabel="matmul FLOPs per training step",
           ylabel="GPU tokens/s ÷ CPU tokens/s", title="When does the GPU help?")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return save(plt, fig, Path(stem), formats)
