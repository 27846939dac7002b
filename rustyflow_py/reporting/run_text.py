"""The lines about a run as a whole: the block's summary line, its evaluation, tokenizer,
data-parallel and loss-scaling lines, and the console summary printed at the end of a run.

With more than one process, or gradient accumulation, a run gets a line saying how each step's
batch was made (and, with several processes, total and per-process tokens/s), and every
tokens/s figure says it is the total over the processes.
"""

from __future__ import annotations

from typing import Any

from ..errors import command
from .analysis import epoch_time, profile_window, replays_per_step
from .comm_text import comm_lines, rank_lines
from .profile_tables import matmul_lines, op_table
from .record_schema import (
    Record,
    RunRecord,
    device_kind,
    is_num,
    model_of,
    model_shape,
    num,
    parallel_of,
    tokenizer_of,
    world_size,
)
from .text import number, on_tokens, one_line


def optimizer_text(r: Record) -> str:
    """The optimizer and its settings: 'adamw (learning_rate=0.001, beta1=0.9, ...)'."""
    settings = r.get("optimizer_settings")
    if not isinstance(settings, dict) or not settings:
        return one_line(r.get("optimizer"))
    return one_line(f"{r.get('optimizer')} (" + ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in settings.items())
        + ")")


def total_note(r: Record) -> str:
    """Said after a tokens/s figure, which sums the processes of a data-parallel run."""
    n = world_size(r)
    return f" (total of {n} processes)" if n > 1 else ""


def summary_line(r: Record) -> str:
    """The block's first line, the whole run on one line: log_parser finds blocks by it."""
    device = f"device={one_line(r.get('device'))} (requested {one_line(r.get('device_requested'))}"
    if r.get("fallback_reason"):
        device += f", fell back: {one_line(r['fallback_reason'])}"
    avg, estimate = epoch_time(r)
    params = model_of(r).get("params")
    parts = [
        f"RustyFlow run {one_line(r.get('timestamp'))}",
        one_line(r.get("status")),
        device + ")",
        one_line(r.get("hardware")),
        one_line(r.get("dataset")),
        f"{model_shape(r)} ({number(params, ',')} params)",
        one_line(r.get("precision")),
        f"epochs {one_line(r.get('epochs'))}/{one_line(r.get('epochs_planned'))}",
        f"avg epoch {number(avg, '.3f', 's')}"
        + (" (extrapolated)" if avg is not None and estimate else ""),
        f"{number(r.get('tokens_per_s'), ',.0f')} tok/s{total_note(r)}",
        f"val ppl {ppl_text(r, 'val')}",
        f"test ppl {ppl_text(r, 'test')}",
        f"ckpt {one_line(r.get('checkpoint'))}",
    ]
    return "=== " + " | ".join(parts) + " ==="


def ppl_text(r: Record, split: str) -> str:
    """`123.45`, or for a subword run `45.67/token 123.45/word`."""
    ppl = number(r.get(f"{split}_ppl"), ".2f")
    if tokenizer_of(r) is None:
        return ppl
    return f"{ppl}/token {number(r.get(f'{split}_ppl_word'), '.2f')}/word"


def tokenizer_lines(r: Record) -> list[str]:
    """Which perplexity is which, for a subword run (nothing for words)."""
    tok = tokenizer_of(r)
    if tok is None:
        return []
    words = tok.get("words") if isinstance(tok.get("words"), dict) else {}
    counts = ", ".join(f"{split} {number(n, ',')}" for split, n in words.items())
    return [f"Tokenizer: {one_line(tok.get('kind'))} ({number(tok.get('vocab'), ',')} tokens, "
            f"sha256 {one_line(tok.get('sha256'))[:12]}): val/test ppl are per token; per word "
            f"of the text (exp(total NLL / words), comparable with TOKENIZER=word): val "
            f"{number(r.get('val_ppl_word'), '.2f')}, test {number(r.get('test_ppl_word'), '.2f')}"
            + (f" (words: {counts})" if counts else "")]


def eval_line(r: Record) -> str:
    """How perplexity was measured, the best validation and whose weights the test measured."""
    line = (f"Evaluation: {one_line(r.get('eval_protocol'))} | best val ppl "
            f"{number(r.get('best_val_ppl'), '.2f')} at step {one_line(r.get('best_step'))}")
    if r.get("best_checkpoint"):
        line += f" ({one_line(r['best_checkpoint'])})"
    line += f" | test ppl {number(r.get('test_ppl'), '.2f')} of {one_line(r.get('test_ppl_of'))}"
    line += _scored(r.get("eval_tokens"))
    return line + (" | early-stopped" if r.get("early_stopped") else "")


def _scored(counts: Any) -> str:
    """` | scored: valid 217,600 tokens, test 20,000 of 245,504 tokens` (EVAL_TOKENS makes a
    subset, and says so); nothing for older blocks, which lack the counts."""
    if not isinstance(counts, dict):
        return ""
    parts = [f"{split} {on_tokens(pair[0], pair[1])}" for split, pair in counts.items()
             if isinstance(pair, list) and len(pair) == 2 and all(map(is_num, pair))]
    return f" | scored: {', '.join(parts)}" if parts else ""


def parallel_lines(r: Record) -> list[str]:
    """How each step's batch was made; nothing for one process without accumulation, which
    is every run logged before data parallelism."""
    p, world = parallel_of(r), world_size(r)
    accum = p.get("grad_accum_steps")
    if world == 1 and not (is_num(accum) and accum > 1):
        return []
    batch = (f"x BATCH_SIZE {one_line(model_of(r).get('batch'))} x GRAD_ACCUM_STEPS "
             f"{one_line(accum)} = effective batch {number(p.get('effective_batch'), ',')} streams")
    if world == 1:
        return [f"Gradient accumulation: 1 process {batch}"]
    line = (f"Data parallel: {world} processes ({one_line(p.get('launcher'))} launcher) {batch}; "
            f"ZeRO-1 optimizer sharding {'on' if p.get('shard_optimizer') else 'off'}")
    buckets = p.get("buckets")
    if is_num(buckets) and buckets > 0:
        line += (f"; {buckets:,} gradient bucket{'s' if buckets != 1 else ''} of <= "
                 f"{number(p.get('bucket_mb'), 'g')} MiB")
    line += f"; gradient summed in {one_line(p.get('grad_reduce_dtype', 'fp32'))}"
    return [line, f"Tokens/s: {number(r.get('tokens_per_s'), ',.0f')} total, "
                  f"{number(p.get('tokens_per_s_per_rank'), ',.0f')} per process"]


def loss_scale_lines(r: Record) -> list[str]:
    """fp16's dynamic loss scaling: where the scale ended and how many steps it skipped."""
    ls = r.get("loss_scale")
    if not isinstance(ls, dict):
        return []
    return [f"Loss scaling: final scale {number(ls.get('scale'), 'g')} | "
            f"{number(ls.get('skipped'), ',')} of {number(r.get('steps'), ',')} steps skipped "
            "(inf/NaN gradients: update not applied, scale halved)"]


def fp8_lines(r: Record) -> list[str]:
    """PRECISION=fp8's casts in the captured step: how many of each format, and the range of
    their last amax and scale (the record lists each tensor's)."""
    tensors = r.get("fp8_tensors")
    if not isinstance(tensors, list) or not tensors:
        return []
    line = f"FP8 casts per step: {len(tensors):,} ({one_line(r.get('fp8_scaling'))} scaling)"
    for fmt in ("e4m3", "e5m2"):
        of = [t for t in tensors if isinstance(t, dict) and t.get("format") == fmt
              and is_num(t.get("amax")) and is_num(t.get("scale"))]
        if of:
            line += (f" | {fmt} {len(of):,}: amax {min(t['amax'] for t in of):.3g} to "
                     f"{max(t['amax'] for t in of):.3g}, scale {min(t['scale'] for t in of):.3g}"
                     f" to {max(t['scale'] for t in of):.3g}")
    return [line + " (the record lists each tensor)"]


def format_summary(record: RunRecord | Record, log: str | None, top: int = 5) -> str:
    """The few lines a person reads at the end of a run: the summary line, the top ops, the
    matmul/other/Amdahl lines, and where the checkpoint and the full block went."""
    r = record
    lines = [summary_line(r)]
    if world_size(r) > 1:
        p = parallel_of(r)
        lines.append(f"Data parallel: {world_size(r)} processes, "
                     f"{number(r.get('tokens_per_s'), ',.0f')} tok/s total "
                     f"({number(p.get('tokens_per_s_per_rank'), ',.0f')} per process), "
                     f"effective batch {number(p.get('effective_batch'), ',')}")
    if r.get("message"):
        lines.append(f"Message: {one_line(r['message'])}")
    if r.get("eval_protocol"):
        lines.append(eval_line(r))
    lines += tokenizer_lines(r)
    prof = r.get("profile")
    if isinstance(prof, dict):
        ops, window = profile_window(prof)
        steps, profiled = int(num(r.get("steps_here", r.get("steps")))), int(
            num(prof.get("profiled_steps")))
        per_step = replays_per_step(prof)
        head = op_table(sorted(ops, key=lambda op: -num(op.get("time_s")))[:top], window,
                        per_step=per_step)
        lines += [f"Top {min(top, len(ops))} ops of {len(ops)}:", *head[:-1]]
        lines += matmul_lines(ops, window, profiled, max(steps, profiled), prof.get("note"),
                              device_kind(r) == "gpu", per_step)
        lines += comm_lines(prof)[:1] + rank_lines(prof)[-1:]  # the step's split, straggler
    ckpt = r.get("checkpoint")
    lines.append(f"Checkpoint: {one_line(ckpt)}" if ckpt else
                 "Checkpoint: none written (see the message above)")
    lines.append(f"Full report: appended to {log} (`{command()} report --log {log}` shows it)"
                 if log else "Full report: not written (see the warning above)")
    return "\n".join(lines)
