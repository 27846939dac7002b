"""The run record: what a run writes as ``[RUN_JSON]``, and how any version of it is read.

A record read back from a log may be of any version and lack any field: blocks written before
a field existed do not have it, and an interrupted run may lack its results. So every reader
here takes a missing or malformed field as "the run does not say" and answers as for an older
block (one process, no tokenizer, no model facts), never failing.

Data parallelism. ``parallel`` (see ``ParallelRecord``; missing in older blocks, read as one
process) says how the batch was made.

Curves. ``curves`` holds ``loss`` (training loss), ``lr`` (the learning rate at the same steps)
and ``val_ppl`` (validation perplexity at every validation), each a list of ``[step, value]``
with at most ``curves.limit`` evenly spaced points, the first and last kept; ``curves.losses``
is how many per-step losses the loss curve was sampled from. Blocks written before curves
existed have no ``curves``; readers treat that as empty curves (``curves.curve``).
"""

from __future__ import annotations

import numbers
from typing import Any, TypedDict

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
    grad_reduce_dtype: str  # fp32 | bf16: the dtype the gradient was summed in (older: fp32)


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
    seed: int  # SEED: initialisation, dropout and window offsets (missing: older blocks)
    data: dict[str, Any]  # the training tokens: {"train_tokens", "train_sha256"}
    model: dict[str, int]  # layers heads embed seq_len batch vocab params
    precision: str
    optimizer: str
    optimizer_settings: dict[str, Any]  # its keys (lower case) and values, schedule included
    # each dropout site's rate as run, word dropout, locked dropout, random offsets, label
    # smoothing, the weight average's keys (missing: older blocks)
    regularisation: dict[str, Any]
    graph: bool
    attention: str  # materialized | flash | cudnn: what computed attention (missing: older)
    epochs: int
    epochs_planned: int
    steps: int  # optimizer steps done in all, resumed ones included
    steps_here: int  # of those, the steps this process ran (tokens/s counts these)
    steps_per_epoch: int
    train_time_s: float  # this process's, evaluation included
    avg_epoch_time_s: float | None
    epoch_times_s: list[float]  # each whole epoch's time in seconds (missing: older blocks)
    no_extrapolation: bool  # a diverged run: no epoch time is estimated from it
    tokens_per_s: float | None  # the total over all processes of a data-parallel run
    parallel: ParallelRecord | None  # missing in older blocks: one process
    loss_scale: dict[str, Any] | None  # fp16 runs: {"scale": final, "skipped": steps}
    # fp8 runs with a captured step: [{"tensor", "format", "shape", "amax", "scale"}] a cast
    fp8_tensors: list[dict[str, Any]] | None
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


# A block's first and last lines, and the tags of its two machine-read lines (log_writer).
BLOCK_START = "=== RustyFlow run "
BLOCK_END = "=== end of run ==="
JSON_TAG = "[RUN_JSON]"
AVG_TAG = "[AVG_EPOCH_TIME]"


def is_num(x: Any) -> bool:
    """True for real numbers, numpy scalars included (the trainer may hand those over)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def num(x: Any) -> float:
    """A record field as a float, 0 when missing: sums over partial records stay defined."""
    return float(x) if is_num(x) else 0.0


def model_of(r: Record) -> Record:
    """The model's shape and size (layers heads embed seq_len batch vocab params); {} when
    the record lacks it."""
    m = r.get("model")
    return m if isinstance(m, dict) else {}


def parallel_of(r: Record) -> Record:
    """The run's data-parallel settings; {} for blocks written before data parallelism."""
    p = r.get("parallel")
    return p if isinstance(p, dict) else {}


def world_size(r: Record) -> int:
    """How many processes trained the run: 1 when the record does not say (older blocks)."""
    n = parallel_of(r).get("world_size")
    return int(n) if is_num(n) and n >= 1 else 1


def device_kind(r: Record) -> str:
    """The device kind: gpu:N is a GPU run too."""
    return str(r.get("device") or "").partition(":")[0]


def tokenizer_of(r: Record) -> dict[str, Any] | None:
    """A subword run's tokenizer record (None: words, and every block before tokenizers)."""
    tok = r.get("tokenizer")
    return tok if isinstance(tok, dict) else None


def model_shape(r: Record) -> str:
    """`L2 H4 E128 T64 B16 V33278`: runs of one shape are compared with each other."""
    m = model_of(r)
    keys = (("L", "layers"), ("H", "heads"), ("E", "embed"), ("T", "seq_len"), ("B", "batch"))
    return " ".join(f"{tag}{m.get(key, '?')}" for tag, key in (*keys, ("V", "vocab")))
