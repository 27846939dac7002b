"""Run reports: the block each run appends to ``training_log.txt``, and ``rustyflow report``.

A block is plain text, self-contained, one per run (written by ``logfile.append_block``)::

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

Only the first line (to find blocks) and the ``[RUN_JSON]`` line (the data) are read back; the
rest is for people and may change. Anything between blocks is ignored, so hand edits there are
harmless.

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

Data parallelism. ``parallel`` (see ``ParallelRecord``; missing in older blocks, read as one
process) says how the batch was made. With more than one process, or gradient accumulation, the
block has a line for it (and, with several processes, total and per-process tokens/s), and every
tokens/s figure says it is the total over the processes. Collectives are ops of category
``comm``: their time gets its own line, and "Other" = window - matmul - comm. On the GPU they
are timed on the step's stream in the profiled window; in the replayed steps the gradient
all-reduce overlaps backward on a second stream, so less of it is exposed there. Amdahl's bound
stays the matmul one. Without ``comm`` ops the lines are exactly those above.

``[AVG_EPOCH_TIME]`` is the mean over completed epochs. When no epoch completed (an interrupted
run, or ``--max-steps`` shorter than an epoch) it is an estimate: the trainer's own
``avg_epoch_time_s`` if set, else ``steps_time_s / timed_steps * steps_per_epoch`` (the
training steps' own time: evaluation, checkpoint writes and start-up out), or in older
records ``(train_time_s - eval) / steps * steps_per_epoch``. A diverged run
(``no_extrapolation``) is never extrapolated. The line above it then says it is an estimate
and the summary line adds "(extrapolated)". With nothing to estimate from, the line is left
out.

Non-finite numbers are written as ``null`` in ``[RUN_JSON]``, so the line is strict JSON.

Curves. ``curves`` holds ``loss`` (training loss), ``lr`` (the learning rate at the same steps)
and ``val_ppl`` (validation perplexity at every validation), each a list of ``[step, value]``
with at most ``curves.limit`` evenly spaced points, the first and last kept; ``curves.losses``
is how many per-step losses the loss curve was sampled from. Blocks written before curves
existed have no ``curves``; readers treat that as empty curves (``curves.curve``).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, TypedDict

from ..errors import command
from . import profile_text
from .curves import curve, sparkline

Record = dict[str, Any]  # a record as read back from a log: any version, any field missing


class ParallelRecord(TypedDict):
    """How a run split its batch over processes and micro-steps (``RunRecord.parallel``)."""

    world_size: int  # processes, one per device
    grad_accum_steps: int
    effective_batch: int  # BATCH_SIZE x GRAD_ACCUM_STEPS x world_size streams per step
    shard_optimizer: bool  # ZeRO-1: each process keeps its shard of the optimizer state
    launcher: str  # mpiexec | srun | none (older logs: rustyflow, torchrun, slurm, openmpi)
    tokens_per_s_per_rank: float | None
    bucket_mb: float  # the gradient all-reduce bucket limit, MiB
    buckets: int  # 0 when no bucketed all-reduce ran (one process, or ZeRO-1)


class RunRecord(TypedDict, total=False):
    """What a run writes as ``[RUN_JSON]`` (version 1). Readers must accept missing fields:
    older blocks lack the later ones, and an interrupted run may lack its results."""

    version: int
    timestamp: str
    status: str  # completed | interrupted | failed
    device: str
    device_requested: str
    fallback_reason: str | None
    hardware: str
    backend: str
    dataset: str
    model: dict[str, int]  # layers heads embed seq_len batch vocab params
    precision: str
    optimizer: str
    optimizer_settings: dict[str, Any]  # its keys (lower case) and values, schedule included
    graph: bool
    epochs: int
    epochs_planned: int
    steps: int  # optimizer steps done in all, resumed ones included
    steps_here: int  # of those, the steps this process ran (tokens/s counts these)
    steps_per_epoch: int
    train_time_s: float  # this process's, evaluation included
    avg_epoch_time_s: float | None
    no_extrapolation: bool  # a diverged run: no epoch time is estimated from it
    tokens_per_s: float | None  # the total over all processes of a data-parallel run
    parallel: ParallelRecord | None  # missing in older blocks: one process
    loss_scale: dict[str, Any] | None  # fp16 runs: {"scale": final, "skipped": steps}
    val_ppl: float | None  # per token (per word when the tokens are words)
    test_ppl: float | None
    # subword runs only: {"kind", "vocab", "sha256", "words": {split: words of its text}}
    tokenizer: dict[str, Any]
    val_ppl_word: float | None  # subword runs: per word of the text (exp(total NLL / words))
    test_ppl_word: float | None
    test_ppl_of: str | None  # whose weights: "best (step N)" or "final (step N)"
    best_val_ppl: float | None
    best_step: int | None
    best_checkpoint: str | None  # MODEL_PATH with -best: the best validated weights
    early_stopped: bool  # PATIENCE ended the run
    eval_protocol: str  # how perplexity was measured ("non-overlapping 64-token windows")
    eval_tokens: dict[str, list[int]]  # split -> [tokens scored, tokens of a full evaluation]
    final_loss: float | None
    checkpoint: str | None
    message: str | None
    profile: dict[str, Any] | None
    # {"limit", "losses" (how many the run had), "loss", "lr", "val_ppl": [[step, value], ...]}
    curves: dict[str, Any]

BLOCK_START = "=== RustyFlow run "
BLOCK_END = "=== end of run ==="
JSON_TAG = "[RUN_JSON]"
AVG_TAG = "[AVG_EPOCH_TIME]"
NA = "n/a"
_PHASES = ("forward", "backward", "optimizer", "data")


# ---------------------------------------------------------------- number formatting


def _is_num(x: Any) -> bool:
    """True for real numbers, numpy scalars included (the trainer may hand those over)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _num(x: Any) -> float:
    """A record field as a float, 0 when missing: sums over partial records stay defined."""
    return float(x) if _is_num(x) else 0.0


def _fmt(x: Any, spec: str, suffix: str = "") -> str:
    return f"{x:{spec}}{suffix}" if _is_num(x) else NA


def _share(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}" if whole > 0 else NA


def _pct(part: float, whole: float) -> str:
    share = _share(part, whole)
    return share if share == NA else share + "%"


def _bytes(n: Any) -> str:
    if not _is_num(n):
        return NA
    value, units = float(n), ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while abs(value) >= 1024 and i < len(units) - 1:
        value, i = value / 1024, i + 1
    if i == 0:
        return f"{value:.0f} B" if value == int(value) else f"{value:.1f} B"
    return f"{value:.1f} {units[i]}"


def _optimizer(r: Record) -> str:
    """The optimizer and its settings: 'adamw (learning_rate=0.001, beta1=0.9, ...)'."""
    settings = r.get("optimizer_settings")
    if not isinstance(settings, dict) or not settings:
        return _text(r.get("optimizer"))
    return _text(f"{r.get('optimizer')} (" + ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in settings.items())
        + ")")


def _text(x: Any) -> str:
    """A free-text field on one line, so it can never forge a block or JSON line."""
    return NA if x is None or x == "" else " ".join(str(x).splitlines())


def _plain(x: Any) -> Any:
    """The record as strict-JSON-ready data (numpy scalars unwrapped, NaN/inf -> None)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if callable(getattr(x, "tolist", None)):
        return _plain(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x if x is None or isinstance(x, str | int | float | bool) else str(x)


# ---------------------------------------------------------------- derived values


def _model(r: Record) -> Record:
    m = r.get("model")
    return m if isinstance(m, dict) else {}


def _parallel(r: Record) -> Record:
    """The run's data-parallel settings; {} for blocks written before data parallelism."""
    p = r.get("parallel")
    return p if isinstance(p, dict) else {}


def _world(r: Record) -> int:
    """How many processes trained the run: 1 when the record does not say (older blocks)."""
    n = _parallel(r).get("world_size")
    return int(n) if _is_num(n) and n >= 1 else 1


def _kind(r: Record) -> str:
    """The device kind: gpu:N is a GPU run too."""
    return str(r.get("device") or "").partition(":")[0]


def _total_note(r: Record) -> str:
    """Said after a tokens/s figure, which sums the processes of a data-parallel run."""
    n = _world(r)
    return f" (total of {n} processes)" if n > 1 else ""


def _shape(r: Record) -> str:
    m = _model(r)
    keys = (("L", "layers"), ("H", "heads"), ("E", "embed"), ("T", "seq_len"), ("B", "batch"))
    return " ".join(f"{tag}{m.get(key, '?')}" for tag, key in (*keys, ("V", "vocab")))


def _epoch_time(r: Record) -> tuple[float | None, str | None]:
    """The average epoch time to report, and why it is an estimate (None when measured)."""
    avg, epochs = r.get("avg_epoch_time_s"), _num(r.get("epochs"))
    if _is_num(avg):
        return float(avg), None if epochs >= 1 else "the trainer's estimate"
    if r.get("no_extrapolation"):
        return None, "not estimated from a diverged run"
    # this process's steps over this process's time (a resumed run ran only some of them)
    steps, per_epoch = r.get("steps_here", r.get("steps")), r.get("steps_per_epoch")
    train = r.get("train_time_s")
    if _is_num(r.get("timed_steps")) and _is_num(r.get("steps_time_s")):
        # evaluation and start-up already out (records since the graph profile)
        steps, step_s = r["timed_steps"], float(r["steps_time_s"])
        excluded = "evaluation and start-up excluded"
    else:
        prof = r.get("profile") if isinstance(r.get("profile"), dict) else {}
        step_s = max(_num(train) - _num((prof.get("phases") or {}).get("eval")), 0.0)
        excluded = "evaluation excluded"
    if _is_num(steps) and _is_num(per_epoch) and _is_num(train) and steps > 0 and per_epoch > 0:
        note = (f"{plural(steps, 'step')} in {step_s:.3f}s ({excluded}) scaled to "
                f"{per_epoch:,} steps/epoch")
        return step_s / steps * per_epoch, note
    return None, "nothing to extrapolate from"


def _human_block(r: Record) -> str:
    return "\n".join(ln for ln in format_block(r).split("\n") if not ln.startswith(JSON_TAG))


# ---------------------------------------------------------------- the block


def _summary_line(r: Record) -> str:
    device = f"device={_text(r.get('device'))} (requested {_text(r.get('device_requested'))}"
    if r.get("fallback_reason"):
        device += f", fell back: {_text(r['fallback_reason'])}"
    avg, estimate = _epoch_time(r)
    params = _model(r).get("params")
    parts = [
        f"RustyFlow run {_text(r.get('timestamp'))}",
        _text(r.get("status")),
        device + ")",
        _text(r.get("hardware")),
        _text(r.get("dataset")),
        f"{_shape(r)} ({_fmt(params, ',')} params)",
        _text(r.get("precision")),
        f"epochs {_text(r.get('epochs'))}/{_text(r.get('epochs_planned'))}",
        f"avg epoch {_fmt(avg, '.3f', 's')}"
        + (" (extrapolated)" if avg is not None and estimate else ""),
        f"{_fmt(r.get('tokens_per_s'), ',.0f')} tok/s{_total_note(r)}",
        f"val ppl {_ppl(r, 'val')}",
        f"test ppl {_ppl(r, 'test')}",
        f"ckpt {_text(r.get('checkpoint'))}",
    ]
    return "=== " + " | ".join(parts) + " ==="


def _subword(r: Record) -> dict[str, Any] | None:
    """A subword run's tokenizer record (None: words, and every block before tokenizers)."""
    tok = r.get("tokenizer")
    return tok if isinstance(tok, dict) else None


def _ppl(r: Record, split: str) -> str:
    """`123.45`, or for a subword run `45.67/token 123.45/word`."""
    ppl = _fmt(r.get(f"{split}_ppl"), ".2f")
    if _subword(r) is None:
        return ppl
    return f"{ppl}/token {_fmt(r.get(f'{split}_ppl_word'), '.2f')}/word"


def _tokenizer_line(r: Record) -> list[str]:
    """Which perplexity is which, for a subword run (nothing for words)."""
    tok = _subword(r)
    if tok is None:
        return []
    words = tok.get("words") if isinstance(tok.get("words"), dict) else {}
    counts = ", ".join(f"{split} {_fmt(n, ',')}" for split, n in words.items())
    return [f"Tokenizer: {_text(tok.get('kind'))} ({_fmt(tok.get('vocab'), ',')} tokens, "
            f"sha256 {_text(tok.get('sha256'))[:12]}): val/test ppl are per token; per word "
            f"of the text (exp(total NLL / words), comparable with TOKENIZER=word): val "
            f"{_fmt(r.get('val_ppl_word'), '.2f')}, test {_fmt(r.get('test_ppl_word'), '.2f')}"
            + (f" (words: {counts})" if counts else "")]


def _eval_line(r: Record) -> str:
    """How perplexity was measured, the best validation and whose weights the test measured."""
    line = (f"Evaluation: {_text(r.get('eval_protocol'))} | best val ppl "
            f"{_fmt(r.get('best_val_ppl'), '.2f')} at step {_text(r.get('best_step'))}")
    if r.get("best_checkpoint"):
        line += f" ({_text(r['best_checkpoint'])})"
    line += f" | test ppl {_fmt(r.get('test_ppl'), '.2f')} of {_text(r.get('test_ppl_of'))}"
    line += _scored(r.get("eval_tokens"))
    return line + (" | early-stopped" if r.get("early_stopped") else "")


def plural(count: int, word: str) -> str:
    """`1 step`, `2 steps`, `1,000 steps`."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def on_tokens(scored: int, full: int) -> str:
    """How much of a split a perplexity is on: `217,600 tokens` or `20,000 of 217,600
    tokens` (an EVAL_TOKENS subset says so wherever its result is shown)."""
    return f"{scored:,} tokens" if scored == full else f"{scored:,} of {full:,} tokens"


def _scored(counts: Any) -> str:
    """` | scored: valid 217,600 tokens, test 20,000 of 245,504 tokens` (EVAL_TOKENS makes a
    subset, and says so); nothing for older blocks, which lack the counts."""
    if not isinstance(counts, dict):
        return ""
    parts = [f"{split} {on_tokens(pair[0], pair[1])}" for split, pair in counts.items()
             if isinstance(pair, list) and len(pair) == 2 and all(map(_is_num, pair))]
    return f" | scored: {', '.join(parts)}" if parts else ""


def _parallel_lines(r: Record) -> list[str]:
    """How each step's batch was made; nothing for one process without accumulation, which
    is every run logged before data parallelism."""
    p, world = _parallel(r), _world(r)
    accum = p.get("grad_accum_steps")
    if world == 1 and not (_is_num(accum) and accum > 1):
        return []
    batch = (f"x BATCH_SIZE {_text(_model(r).get('batch'))} x GRAD_ACCUM_STEPS {_text(accum)} "
             f"= effective batch {_fmt(p.get('effective_batch'), ',')} streams")
    if world == 1:
        return [f"Gradient accumulation: 1 process {batch}"]
    line = (f"Data parallel: {world} processes ({_text(p.get('launcher'))} launcher) {batch}; "
            f"ZeRO-1 optimizer sharding {'on' if p.get('shard_optimizer') else 'off'}")
    buckets = p.get("buckets")
    if _is_num(buckets) and buckets > 0:
        line += (f"; {buckets:,} gradient bucket{'s' if buckets != 1 else ''} of <= "
                 f"{_fmt(p.get('bucket_mb'), 'g')} MiB")
    return [line, f"Tokens/s: {_fmt(r.get('tokens_per_s'), ',.0f')} total, "
                  f"{_fmt(p.get('tokens_per_s_per_rank'), ',.0f')} per process"]


def _loss_scale_lines(r: Record) -> list[str]:
    """fp16's dynamic loss scaling: where the scale ended and how many steps it skipped."""
    ls = r.get("loss_scale")
    if not isinstance(ls, dict):
        return []
    return [f"Loss scaling: final scale {_fmt(ls.get('scale'), 'g')} | "
            f"{_fmt(ls.get('skipped'), ',')} of {_fmt(r.get('steps'), ',')} steps skipped "
            "(inf/NaN gradients: update not applied, scale halved)"]


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """Plain aligned text columns: stable without a TTY, and diffable in the log."""
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)]


def _op_lines(ops: list[Record], window: float, idle: float | None = None,
              per_step: int | None = None) -> list[str]:
    """The per-op table, longest first, with its shares of `window`; `idle` (a graph profile's
    device time between kernels) gets a row of its own before the total. With `per_step` (a
    graph profile's sampled replays) calls and times are per step, in milliseconds."""
    n = per_step or 1
    time_text = (lambda secs: f"{secs * 1e3 / n:.3f}") if per_step else (lambda secs: f"{secs:.3f}")
    rows = []
    for op in sorted(ops, key=lambda op: -_num(op.get("time_s"))):
        calls, secs = op.get("calls"), _num(op.get("time_s"))
        per_call = secs * 1e3 / calls if _is_num(calls) and calls > 0 else None
        rows.append(
            [
                _text(op.get("name")),
                _text(op.get("phase")),
                _text(op.get("category")),
                (_fmt(calls / n if _is_num(calls) else None, ",.4g") if per_step
                 else _fmt(calls, ",")),
                time_text(secs),
                _fmt(per_call, ".3f"),
                _share(secs, window),
            ]
        )
    total = sum(_num(op.get("time_s")) for op in ops)
    calls = sum(int(_num(op.get("calls"))) for op in ops)
    if idle is not None:
        rows.append(["(idle between kernels)", "", "", "", time_text(idle), "",
                     _share(idle, window)])
        total += idle
    rows.append(["all ops", "", "", f"{calls / n:,.4g}" if per_step else f"{calls:,}",
                 time_text(total), "", _share(total, window)])
    headers = ["Op", "Phase", "Category", "Calls/step" if per_step else "Calls",
               "ms/step" if per_step else "Total s", "ms/call", "Share %"]
    return _table(headers, rows, right={3, 4, 5, 6})


def _per_step(prof: Record) -> int | None:
    """A graph profile's sampled replays (its table is per step); None for the others."""
    s = prof.get("sampling") if isinstance(prof.get("sampling"), dict) else {}
    n = s.get("replays")
    return int(n) if prof.get("timing") == "cupti-graph" and _is_num(n) and n > 0 else None


_COMM_GPU = ("Communication time (NCCL collectives, measured on the step's stream in the "
             "profiled steps; they overlap backward in replayed steps)")
_COMM_CPU = ("Communication time (collectives over sockets between the processes, host wall time, "
             "waits for the other processes included)")


def _category_time(ops: list[Record], category: str) -> float:
    return sum(_num(op.get("time_s")) for op in ops if op.get("category") == category)


def _matmul_lines(
    ops: list[Record], window: float, profiled: int, steps: int, note: Any, gpu: bool,
    per_step: int | None = None,
) -> list[str]:
    """Matmul, communication (data-parallel runs only) and the rest of the window, and the
    matmul Amdahl bound. Other excludes the collectives so the three shares add up. With
    `per_step` (a graph profile's sampled replays) the times are milliseconds per step."""
    matmul, comm = _category_time(ops, "matmul"), _category_time(ops, "comm")
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
        f"Total matmul time (CPU + GPU): {amount(matmul)} ({_pct(matmul, window)} of the "
        f"{whole})",
    ]
    if has_comm:
        label = _COMM_GPU if gpu else _COMM_CPU
        lines.append(f"{label}: {amount(comm)} ({_pct(comm, window)} of the same)")
    excluded = "communication and eval" if has_comm else "eval"
    lines += [
        f"Other time (non-matmul ops, data loading and framework overhead; {excluded} "
        f"excluded): {amount(other)} ({_pct(other, window)} of the same)",
        f"Amdahl's bound: {bound} max speed-up from faster matmuls alone (p={_fmt(p, '.3f')})",
    ]
    if profiled < steps and per_step:
        lines.append(f"Per-op numbers and shares come from {plural(profiled, 'sampled replay')}"
                     f" of the {steps:,} training steps, all replays of one captured step")
    elif profiled < steps:
        lines.append(
            f"Per-op numbers and shares come from the profiled window ({profiled:,} of "
            f"{steps:,} steps, {window:.3f}s), not the whole run: {_text(note)}"
        )
    return lines


def _phase_lines(r: Record, prof: Record, window: float) -> list[str]:
    phases = prof.get("phases") or {}
    rows = [
        [
            name,
            _fmt(phases.get(name), ".3f"),
            _share(_num(phases.get(name)), window),
            "profiled window",
        ]
        for name in _PHASES
    ]
    train = _num(r.get("train_time_s"))
    for aside in ("eval", "checkpoint"):  # outside the steps: shares of the run's time
        if aside in phases:
            value = phases.get(aside)
            rows.append([aside, _fmt(value, ".3f"), _share(_num(value), train), "training time"])
    lines = ["Phase split", *_table(["Phase", "Time s", "Share %", "Of"], rows, right={1, 2})]
    host, busy = prof.get("host_launch_s"), prof.get("device_busy_s")
    if host is not None:  # an eager window: the host launching against the device working
        lines.append(
            f"GPU host vs device: host launching {_fmt(host, '.3f', 's')}, device busy "
            f"{_fmt(busy, '.3f', 's')} ({_pct(_num(busy), window)} of the {window:.3f}s window)"
        )
    return lines


def _traffic_lines(prof: Record) -> list[str]:
    t = prof.get("transfers")
    if not isinstance(t, dict):
        return []
    n = t.get("steps") if _is_num(t.get("steps")) else 0
    per, total = [], []
    for kind in ("h2d", "d2h"):
        count, size = t.get(f"{kind}_count"), t.get(f"{kind}_bytes")
        total.append(f"{kind.upper()} {_fmt(count, ',')} copies ({_bytes(size)})")
        if n > 0 and _is_num(count) and _is_num(size):
            per.append(f"{kind.upper()} {count / n:.2f} copies ({_bytes(size / n)})")
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
            f"Memory: peak GPU pool used {_bytes(m.get('peak_bytes'))} of "
            f"{_bytes(m.get('pool_total_bytes'))} pool total"
        ]
    return [f"Memory: peak process RSS {_bytes(m.get('peak_bytes'))}"]


def _floor_lines(prof: Record) -> list[str]:
    f = prof.get("matmul_floor")
    if not isinstance(f, dict):
        return []
    floor, step = f.get("floor_s_per_step"), f.get("step_s")
    ok = _is_num(floor) and _is_num(step) and floor > 0
    ratio = f"{step / floor:.2f}x the floor" if ok else NA
    if ok and step < floor:  # a floor the steps beat was measured on a busy machine
        ratio = (f"{step / floor:.2f}x: faster than this floor, whose GEMM rate was measured "
                 "while other work slowed it; no bound here")
    floor_ms = _fmt(floor * 1e3 if _is_num(floor) else None, ".3f")
    step_ms = _fmt(step * 1e3 if _is_num(step) else None, ".3f")
    return [
        f"Matmul floor: {floor_ms} ms/step at {_fmt(f.get('gflops'), '.1f')} GFLOP/s measured "
        f"GEMM rate vs {step_ms} ms/step real ({ratio})"
    ]


def _profile_lines(r: Record) -> list[str]:
    prof = r.get("profile")
    if not isinstance(prof, dict):
        return ["Profile: none (profiling was off, or the run ended before a profiled step)"]
    ops = [op for op in prof.get("ops") or [] if isinstance(op, dict)]
    window = prof.get("profiled_time_s")
    if not (_is_num(window) and window > 0):
        window = sum(_num(op.get("time_s")) for op in ops)
    steps, profiled = int(_num(r.get("steps"))), int(_num(prof.get("profiled_steps")))
    graph = prof.get("timing") == "cupti-graph"
    what = "device time" if graph or _kind(r) == "gpu" else "wall"
    head = (
        f"Per-op profile ({_text(prof.get('timing'))}): {_text(prof.get('note'))}; "
        f"{profiled:,} of {steps:,} steps profiled"
        + ("" if graph else f", {window:.3f}s {what}")
    )
    idle = _idle_row(prof) if graph else None
    per_step = _per_step(prof)
    return [
        head,
        *_op_lines(ops, window, idle, per_step),
        *_matmul_lines(ops, window, profiled, steps, prof.get("note"), _kind(r) == "gpu",
                       per_step),
        *profile_text.graph_lines(prof, r.get("train_time_s")),
        "",
        *_phase_lines(r, prof, window),
        "",
        *profile_text.kernel_lines(r),
        *profile_text.roofline_lines(r),
        *_traffic_lines(prof),
        *_memory_lines(prof),
        *_floor_lines(prof),
    ]


def _idle_row(prof: Record) -> float | None:
    """Seconds the replayed steps' device was idle between kernels (a row of its own, so
    the table adds up to the step's device time)."""
    s = prof.get("sampling") if isinstance(prof.get("sampling"), dict) else {}
    span, busy = s.get("span_s"), s.get("busy_s")
    return max(span - busy, 0.0) if _is_num(span) and _is_num(busy) else None


def format_block(record: Record) -> str:
    """The run's self-contained block: printed to the console and appended to the log.

    Missing or None fields print as ``n/a`` rather than failing: the block is written at the
    very end of a run, often an interrupted or failed one, and must never lose the record.
    """
    r = record
    avg, estimate = _epoch_time(r)
    lines = [
        _summary_line(r),
        f"Backend: {_text(r.get('backend'))} | optimizer {_optimizer(r)} | "
        f"CUDA graph replay: {'yes' if r.get('graph') else 'no'} | "
        f"final loss {_fmt(r.get('final_loss'), '.4f')}",
    ]
    if r.get("message"):
        lines.append(f"Message: {_text(r['message'])}")
    if r.get("eval_protocol"):
        lines.append(_eval_line(r))
    lines += [
        *_tokenizer_line(r),
        f"Total training time: {_fmt(r.get('train_time_s'), '.3f', 's')} | average epoch time: "
        f"{_fmt(avg, '.3f', 's')}{' (estimate)' if avg is not None and estimate else ''} | "
        f"tokens/s: {_fmt(r.get('tokens_per_s'), ',.0f')}{_total_note(r)} | "
        f"steps: {_fmt(r.get('steps'), ',')}",
        *profile_text.startup_line(r),
        *_parallel_lines(r),
        *_loss_scale_lines(r),
        "",
        *_profile_lines(r),
        "",
    ]
    done = f"{_text(r.get('status'))}, {_text(r.get('epochs'))}/{_text(r.get('epochs_planned'))}"
    done += " epochs completed"
    if avg is None:
        lines.append(f"Average epoch time: not available ({done}; {estimate})")
    else:
        if estimate:
            lines.append(f"Average epoch time is an estimate ({done}): {estimate}")
        lines.append(f"{AVG_TAG} {avg:.6f}")
    payload = json.dumps(_plain(r), separators=(",", ":"), allow_nan=False)
    lines += [f"{JSON_TAG} {payload}", BLOCK_END]
    return "\n".join(lines) + "\n"


def format_summary(record: RunRecord | Record, log: str | None, top: int = 5) -> str:
    """The few lines a person reads at the end of a run: the summary line, the top ops, the
    matmul/other/Amdahl lines, and where the checkpoint and the full block went."""
    r = record
    lines = [_summary_line(r)]
    if _world(r) > 1:
        p = _parallel(r)
        lines.append(f"Data parallel: {_world(r)} processes, "
                     f"{_fmt(r.get('tokens_per_s'), ',.0f')} tok/s total "
                     f"({_fmt(p.get('tokens_per_s_per_rank'), ',.0f')} per process), "
                     f"effective batch {_fmt(p.get('effective_batch'), ',')}")
    if r.get("message"):
        lines.append(f"Message: {_text(r['message'])}")
    if r.get("eval_protocol"):
        lines.append(_eval_line(r))
    lines += _tokenizer_line(r)
    prof = r.get("profile")
    if isinstance(prof, dict):
        ops = [op for op in prof.get("ops") or [] if isinstance(op, dict)]
        window = prof.get("profiled_time_s")
        if not (_is_num(window) and window > 0):
            window = sum(_num(op.get("time_s")) for op in ops)
        steps, profiled = int(_num(r.get("steps_here", r.get("steps")))), int(
            _num(prof.get("profiled_steps")))
        per_step = _per_step(prof)
        head = _op_lines(sorted(ops, key=lambda op: -_num(op.get("time_s")))[:top], window,
                         per_step=per_step)
        lines += [f"Top {min(top, len(ops))} ops of {len(ops)}:", *head[:-1]]
        lines += _matmul_lines(ops, window, profiled, max(steps, profiled), prof.get("note"),
                               _kind(r) == "gpu", per_step)
    ckpt = r.get("checkpoint")
    lines.append(f"Checkpoint: {_text(ckpt)}" if ckpt else
                 "Checkpoint: none written (see the message above)")
    lines.append(f"Full report: appended to {log} (`{command()} report --log {log}` shows it)"
                 if log else "Full report: not written (see the warning above)")
    return "\n".join(lines)


# ---------------------------------------------------------------- reading the log back


def _blocks(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line number, summary line, body lines) of each block; text outside blocks is skipped."""
    start, head, body = 0, "", []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if line.startswith(BLOCK_START):
            if start:
                yield start, head, body
            start, head, body = number, line, []
        elif start and line == BLOCK_END:
            yield start, head, body
            start = 0
        elif start:
            body.append(line)
    if start:
        yield start, head, body


def parse_log(text: str, warnings: list[str] | None = None) -> list[Record]:
    """Every run record in the log text, in file order, read from the ``[RUN_JSON]`` lines.

    A block whose JSON line is missing or incomplete (a truncated last block, a hand edit) is
    skipped, and a line saying so is appended to ``warnings`` when a list is given. Unknown
    fields and newer record versions are kept as they are.
    """
    records: list[Record] = []
    for number, head, body in _blocks(text):
        where = f"line {number} ({head[:60]}...)"
        payload = next((ln[len(JSON_TAG) :] for ln in body if ln.startswith(JSON_TAG)), None)
        if payload is None:
            problem = f"{where}: no {JSON_TAG} line (truncated or edited); block skipped"
        else:
            try:
                record = json.loads(payload)
            except ValueError as exc:
                problem = f"{where}: {JSON_TAG} is not valid JSON ({exc}); block skipped"
            else:
                if isinstance(record, dict):
                    records.append(record)
                    continue
                problem = f"{where}: {JSON_TAG} is not an object; block skipped"
        if warnings is not None:
            warnings.append(problem)
    return records


def read_log(path: str | Path, warnings: list[str] | None = None) -> list[Record]:
    """The records of the log file at ``path`` (see :func:`parse_log`)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"training_log.txt not found at {p}: run `rustyflow train` first (or pass --log FILE)"
        )
    return parse_log(p.read_text(encoding="utf-8", errors="replace"), warnings)


# ---------------------------------------------------------------- rustyflow report


def speedups(records: list[Record]) -> list[Record]:
    """CPU vs GPU for each dataset and model shape: the latest completed run of each device.
    One-process runs only: several GPUs against one CPU process is not a device comparison
    (:func:`scaling` compares process counts)."""
    groups: dict[tuple[str, str], dict[str, Record]] = {}
    for r in records:
        kind = _kind(r)
        if r.get("status") == "completed" and kind in ("cpu", "gpu") and _world(r) == 1:
            key = (_text(r.get("dataset")), _shape(r))
            groups.setdefault(key, {})[kind] = r
    out = []
    for (dataset, shape), runs in groups.items():
        if "cpu" not in runs or "gpu" not in runs:
            continue
        cpu, gpu = runs["cpu"], runs["gpu"]
        cpu_epoch, gpu_epoch = _epoch_time(cpu)[0], _epoch_time(gpu)[0]
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
                    if _is_num(cpu_tok) and _is_num(gpu_tok) and cpu_tok > 0
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
        if r.get("status") == "completed" and _kind(r) == "gpu" and _is_num(tok) and tok > 0:
            key = (_text(r.get("dataset")), _shape(r), _text(r.get("precision")))
            groups.setdefault(key, {})[_world(r)] = r
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


def _run_row(r: Record) -> list[str]:
    used, requested = _text(r.get("device")), r.get("device_requested")
    if _world(r) > 1:
        used += f" x{_world(r)}"
    if r.get("fallback_reason") or requested not in (None, "auto", r.get("device")):
        used += f" (req {_text(requested)})"
    avg, estimate = _epoch_time(r)
    return [
        _text(r.get("timestamp")),
        _text(r.get("status")),
        used,
        _text(r.get("hardware")),
        _text(r.get("dataset")),
        _shape(r),
        _text(r.get("precision")),
        f"{_text(r.get('epochs'))}/{_text(r.get('epochs_planned'))}",
        ("~" if estimate and avg is not None else "") + _fmt(avg, ".3f"),
        _fmt(r.get("tokens_per_s"), ",.0f"),
        _ppl(r, "val"),
        _ppl(r, "test"),
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
        f"{_text(s['cpu_run'])} {_text(s['cpu_precision'])}",
        f"{_text(s['gpu_run'])} {_text(s['gpu_precision'])}",
        _fmt(s["cpu_avg_epoch_s"], ".3f"),
        _fmt(s["gpu_avg_epoch_s"], ".3f"),
        _fmt(s["epoch_speedup"], ".2f", "x"),
        _fmt(s["cpu_tokens_per_s"], ",.0f"),
        _fmt(s["gpu_tokens_per_s"], ",.0f"),
        _fmt(s["tokens_per_s_ratio"], ".2f", "x"),
    ]


def _scaling_row(s: Record) -> list[str]:
    return [
        s["dataset"],
        s["shape"],
        s["precision"],
        str(s["world_size"]),
        _text(s["one_process_run"]),
        _text(s["run"]),
        _fmt(s["one_process_tokens_per_s"], ",.0f"),
        _fmt(s["tokens_per_s"], ",.0f"),
        _fmt(s["speedup"], ".2f", "x"),
        _fmt(100.0 * s["efficiency"], ".1f", "%"),
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


def _markdown(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|"
    return [line(headers), rule, *(line(row) for row in rows)]


def render_report(
    records: list[Record],
    fmt: Literal["table", "markdown", "json"] = "table",
    last: int | None = None,
) -> str:
    """The ``rustyflow report`` output: runs, CPU-vs-GPU speed-ups, data-parallel scaling, the
    latest run's report.

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
        return json.dumps(_plain(doc), indent=2, allow_nan=False) + "\n"
    if fmt not in ("table", "markdown"):
        raise ValueError(f"unknown report format {fmt!r}: expected table, markdown or json")
    md = fmt == "markdown"
    table = _markdown if md else _table
    out: list[str] = []

    def section(title: str, lines: list[str]) -> None:
        out.extend(([""] if out else []) + ([f"## {title}", ""] if md else [title]) + lines)

    runs = [_run_row(r) for r in records]
    run_lines = table(_RUN_HEADERS, runs, {7, 8, 9, 10, 11}) if runs else ["No runs in the log."]
    if any(row[8].startswith("~") for row in runs):
        run_lines.append("~ estimated: no epoch completed (see that run's block)")
    section(f"Runs ({len(runs)})", run_lines)
    pairs = [_speedup_row(s) for s in pairs_found]
    section(
        "CPU vs GPU speed-up (latest completed run of each, same dataset and shape)",
        table(_SPEEDUP_HEADERS, pairs, {4, 5, 6, 7, 8, 9}) if pairs else [_NO_SPEEDUP],
    )
    if scaled:
        section(
            "Data-parallel scaling (GPU; latest completed run of each process count vs the latest "
            "1-process run, same dataset, shape and precision)",
            table(_SCALING_HEADERS, [_scaling_row(s) for s in scaled], {3, 6, 7, 8, 9}),
        )
    curved = [r for r in records if curve(r, "loss")]
    if curved:
        r = curved[-1]
        lines = _curve_lines(r)
        section(f"Loss curve: run {_text(r.get('timestamp'))} ({_text(r.get('device'))}, "
                f"{_shape(r)})", ["```text", *lines, "```"] if md else lines)
    if latest is not None:
        body = _human_block(latest).rstrip("\n")
        title = f"Latest profiling report: run {_text(latest.get('timestamp'))}"
        section(title, ["```text", body, "```"] if md else [body])
    return "\n".join(out) + "\n"
