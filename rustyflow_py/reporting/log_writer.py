"""The block each run appends to ``training_log.txt`` (through ``logfile.append_block``).

A block is plain text, self-contained, one per run::

    === RustyFlow run <timestamp UTC> | <status> | device=<used> (requested <req>[, fell back:
        <why>]) | <hardware> | <dataset> | L.. H.. E.. T.. B.. V.. (<n> params) | <precision> |
        epochs <done>/<planned> | avg epoch <s>s | <n> tok/s | val ppl <v> | test ppl <t> |
        ckpt <path> ===                                      (one line)
    <the report for people: totals, [data-parallel lines], per-op table, matmul /
     [communication /] other / Amdahl lines, phases, host<->device traffic, memory, CPU
     matmul floor>
    [AVG_EPOCH_TIME] <seconds>
    [RUN_JSON] <the whole run record as compact, strict JSON>
    === end of run ===

Only the first line (to find blocks) and the ``[RUN_JSON]`` line (the data) are read back
(log_parser); the rest is for people and may change. Anything between blocks is ignored, so
hand edits there are harmless.

``[AVG_EPOCH_TIME]`` is analysis.epoch_time's. When it is an estimate, the line above it says
so and the summary line adds "(extrapolated)"; with nothing to estimate from, the line is left
out.

Non-finite numbers are written as ``null`` in ``[RUN_JSON]``, so the line is strict JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

from . import profile_text
from .analysis import epoch_time
from .profile_tables import profile_lines
from .record_schema import AVG_TAG, BLOCK_END, JSON_TAG, Record
from .run_text import (
    eval_line,
    fp8_lines,
    loss_scale_lines,
    optimizer_text,
    parallel_lines,
    summary_line,
    tokenizer_lines,
    total_note,
)
from .text import number, one_line


def plain(x: Any) -> Any:
    """The record as strict-JSON-ready data (numpy scalars unwrapped, NaN/inf -> None)."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    if callable(getattr(x, "tolist", None)):
        return plain(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x if x is None or isinstance(x, str | int | float | bool) else str(x)


def attention_text(r: Record) -> str:
    """What computed attention, where the record says (records before it did not)."""
    return f"attention: {r['attention']} | " if r.get("attention") else ""


def format_block(record: Record) -> str:
    """The run's self-contained block: printed to the console and appended to the log.

    Missing or None fields print as ``n/a`` rather than failing: the block is written at the
    very end of a run, often an interrupted or failed one, and must never lose the record.
    """
    r = record
    avg, estimate = epoch_time(r)
    lines = [
        summary_line(r),
        f"Backend: {one_line(r.get('backend'))} | optimizer {optimizer_text(r)} | "
        f"CUDA graph replay: {'yes' if r.get('graph') else 'no'} | "
        f"{attention_text(r)}final loss {number(r.get('final_loss'), '.4f')}",
    ]
    if r.get("message"):
        lines.append(f"Message: {one_line(r['message'])}")
    if r.get("eval_protocol"):
        lines.append(eval_line(r))
    lines += [
        *tokenizer_lines(r),
        f"Total training time: {number(r.get('train_time_s'), '.3f', 's')} | average epoch time: "
        f"{number(avg, '.3f', 's')}{' (estimate)' if avg is not None and estimate else ''} | "
        f"tokens/s: {number(r.get('tokens_per_s'), ',.0f')}{total_note(r)} | "
        f"steps: {number(r.get('steps'), ',')}",
        *profile_text.startup_line(r),
        *parallel_lines(r),
        *loss_scale_lines(r),
        *fp8_lines(r),
        "",
        *profile_lines(r),
        "",
    ]
    done = (f"{one_line(r.get('status'))}, {one_line(r.get('epochs'))}/"
            f"{one_line(r.get('epochs_planned'))} epochs completed")
    if avg is None:
        lines.append(f"Average epoch time: not available ({done}; {estimate})")
    else:
        if estimate:
            lines.append(f"Average epoch time is an estimate ({done}): {estimate}")
        lines.append(f"{AVG_TAG} {avg:.6f}")
    payload = json.dumps(plain(r), separators=(",", ":"), allow_nan=False)
    lines += [f"{JSON_TAG} {payload}", BLOCK_END]
    return "\n".join(lines) + "\n"
