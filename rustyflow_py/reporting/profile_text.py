"""The profile's drill-down for people: start-up, the replayed step's device time, each op's
kernels, and each op against its hardware limit (the roofline).

Everything here is read from a run record's `profile` (and `startup`), as written by
training/outputs/record.py, so `rustyflow report` renders old and new blocks alike: what a record
lacks is left out, never made up.
"""

from __future__ import annotations

import math
from typing import Any

from ..engine.kernel_records import short_kernel_name
from ..engine.peaks import compute_type

Record = dict[str, Any]


def _num(x: Any) -> float:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else 0.0


def startup_line(r: Record) -> list[str]:
    """'Start-up: ...' for a GPU run that measured it; nothing otherwise."""
    up = r.get("startup")
    if not isinstance(up, dict) or not _num(up.get("first_step_s")):
        return []
    cache = up.get("cache")
    cache_text = f"kernel cache {cache}" if cache in ("cold", "warm") else "kernel cache unknown"
    capture = (f", graph capture {_num(up.get('capture_s')):.3f}s"
               if _num(up.get("capture_s")) else "")
    return [f"Start-up: first step {_num(up.get('first_step_s')):.3f}s (kernel compilation and "
            f"GEMM plans; {cache_text}){capture}; kept out of the epoch times and tokens/s"]


def graph_lines(prof: Record, run_s: float | None) -> list[str]:
    """The sampled replays: how many, their device time against the per-op sum and the
    device-busy time, the wall time per training step, and what sampling cost."""
    s = prof.get("sampling")
    if not isinstance(s, dict) or not s.get("replays"):
        return []
    n = int(_num(s.get("replays")))
    span, busy, kernels = (_num(s.get(k)) for k in ("span_s", "busy_s", "kernel_s"))
    gap = max(span - busy, 0.0)
    drift = 100.0 * (kernels - busy) / busy if busy > 0 else 0.0
    lines = [
        f"Replayed step on the device: {1e3 * span / n:.3f} ms (kernels busy "
        f"{1e3 * busy / n:.3f} ms, idle between kernels {1e3 * gap / n:.3f} ms)"
        + (f", mean of {n} sampled replays" if n > 1 else ", one sampled replay"),
        f"Check: per-op times sum to {1e3 * kernels / n:.3f} ms/step, {drift:+.2f}% of the "
        "device-busy time of the same replays",
    ]
    wall = prof.get("step_wall_s")
    if _num(wall) > 0:
        lines.append(f"Wall time per training step: {1e3 * _num(wall):.3f} ms (host work and "
                     f"waits between replays: {1e3 * max(_num(wall) - span / n, 0.0):.3f} ms)")
    cost = _num(s.get("cost_s"))
    share = f", {100.0 * cost / run_s:.2f}% of the run's wall time" if _num(run_s) > 0 else ""
    lines.append(f"Sampling cost: {cost:.3f}s{share}")
    return lines


def roofline(ops: list[Record], peaks: Any, precision: str, steps: int) -> list[Record]:
    """Each op against its limit: GEMM ops by achieved TFLOP/s against the peak of their
    compute type, the others by GB/s (bytes of the arrays at the op boundary, an estimate)
    against the memory bandwidth; fused ops whose GEMMs are entries of their own are left to
    those entries. Rows: name, phase, kind, ms/step, rate, peak, share."""
    peaks = peaks if isinstance(peaks, dict) else {}
    tflops, bandwidth = peaks.get("tflops") or {}, peaks.get("bandwidth_gbs")
    # a fused op whose products are its `.matmul` entry: the arrays at its boundary are moved
    # by those GEMMs, not by its own (self-time) kernels, so it has no memory roofline
    fused = {(str(op.get("name"))[: -len(".matmul")], op.get("phase")) for op in ops
             if str(op.get("name")).endswith(".matmul")}
    rows = []
    for op in ops:
        secs = _num(op.get("time_s"))
        if secs <= 0 or (op.get("name"), op.get("phase")) in fused:
            continue
        flops, nbytes = _num(op.get("flops")), _num(op.get("bytes"))
        row: Record = {"name": op.get("name"), "phase": op.get("phase"),
                       "ms_per_step": 1e3 * secs / max(steps, 1), "time_s": secs,
                       "bytes_per_step": nbytes / max(steps, 1),
                       "intensity": flops / nbytes if nbytes > 0 else None}
        if flops > 0:
            gemms = op.get("gemms") or [{}]
            dtype = str(gemms[0].get("dtypes", "float32")).split("->")[0]
            kind = compute_type(dtype, precision)
            peak = tflops.get(kind)
            rate = flops / secs / 1e12
            row.update(kind=f"GEMM {kind}", rate=rate, unit="TFLOP/s", peak=peak,
                       shape=gemms[0].get("shape"))
        elif nbytes > 0:
            rate = nbytes / secs / 1e9
            row.update(kind="memory", rate=rate, unit="GB/s", peak=bandwidth)
        else:
            continue
        row["share"] = row["rate"] / row["peak"] if row.get("peak") else None
        rows.append(row)
    return sorted(rows, key=lambda r: -r["time_s"])


def roofline_lines(r: Record, top: int = 10) -> list[str]:
    """The longest ops against their limits, with where the peaks came from."""
    prof = r.get("profile") if isinstance(r.get("profile"), dict) else {}
    steps = int(_num(prof.get("profiled_steps"))) or 1
    rows = roofline([op for op in prof.get("ops") or [] if isinstance(op, dict)],
                    prof.get("peaks"), str(r.get("precision", "fp32")), steps)
    if not rows:
        return []
    peaks = prof.get("peaks") or {}
    lines = [f"Roofline (top {min(top, len(rows))} ops by time; peaks: "
             f"{peaks.get('source', 'unknown')}; an op's bytes are its arrays', an estimate)"]
    for row in rows[:top]:
        peak = (f" of {_rate(row['peak'], row['unit'])} ({100 * row['share']:.1f}%)"
                if row.get("share") is not None else " (no peak known)")
        shape = f" (batch, M, N, K)={tuple(row['shape'])}" if row.get("shape") else ""
        lines.append(f"  {row['name']} [{row['phase']}] {row['ms_per_step']:.3f} ms/step: "
                     f"{row['kind']} {_rate(row['rate'], row['unit'])}{peak}{shape}")
    return lines


def _rate(value: float, unit: str) -> str:
    """A rate in its unit, or in GFLOP/s below one TFLOP/s (a CPU's)."""
    if unit == "TFLOP/s" and value < 1.0:
        return f"{value * 1e3:,.1f} GFLOP/s"
    return f"{value:,.1f} {unit}"


def kernel_lines(r: Record, top_ops: int = 8, per_op: int = 4) -> list[str]:
    """Each of the longest ops' kernels: name, launches and ms per step."""
    prof = r.get("profile") if isinstance(r.get("profile"), dict) else {}
    steps = int(_num(prof.get("profiled_steps"))) or 1
    ops = [op for op in prof.get("ops") or [] if isinstance(op, dict) and op.get("kernels")]
    if not ops:
        return []
    total = sum(len(op["kernels"]) for op in ops)
    lines = [f"Kernels of the top {min(top_ops, len(ops))} ops ({total} distinct kernels in "
             "all; every one is in the run record)"]
    for op in sorted(ops, key=lambda op: -_num(op.get("time_s")))[:top_ops]:
        lines.append(f"  {op.get('name')} [{op.get('phase')}] "
                     f"{1e3 * _num(op.get('time_s')) / steps:.3f} ms/step")
        for k in op["kernels"][:per_op]:
            lines.append(f"    {1e3 * _num(k.get('time_s')) / steps:8.3f} ms  "
                         f"x{_num(k.get('calls_per_step')):g}  "
                         f"{short_kernel_name(str(k.get('name')))}")
        if len(op["kernels"]) > per_op:
            lines.append(f"    ... {len(op['kernels']) - per_op} more")
    return lines
