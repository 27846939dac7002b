"""Loading a trained model and measuring perplexity (per token, and per word for subwords)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ... import data
from ...data import Vocab
from ...engine.backend import parse_device
from ...engine.devices import gpu_capability
from ...engine.library import get_backend
from ...engine.policy import DEFAULT, RunPolicy
from ...engine.precision import Precision, has_fp8_gemms
from ...engine.tensor import Tensor, no_grad
from ...errors import DataError
from ...model.generate import Sampling, Session
from ...model.gpt import GPT, build_model
from ...reporting.text import on_tokens
from ..config.config import Config, ConfigError
from ..outputs.checkpoint import Checkpoint, CheckpointError
from ..start import sizing
from ..subword.corpus import checkpoint_tokenizer, load_corpus
from ..subword.text import SubwordText


def load_model(path: str, device: str, threads: int = 0) -> tuple[GPT, Checkpoint, Config]:
    """A GPT with a checkpoint's weights on `device` (whichever device trained it), on the
    backend of the checkpoint's policy (load_policy) with `threads` CPU threads (0: all)."""
    ckpt = Checkpoint(path)
    try:
        cfg = Config.from_dict(ckpt.config)
    except ConfigError as exc:
        raise CheckpointError(f"{path}: its stored configuration is invalid ({exc})") from None
    vocab = len(ckpt.vocab)
    backend = get_backend(device, load_policy(cfg, threads, device))
    sizing.check_fits(cfg, vocab, backend, "evaluation")
    precision = backend.policy.precision  # mixed precision is GPU-only: fp32 on the CPU
    model = build_model(cfg, vocab, backend, precision.storage,
                        compute=precision.compute if backend.kind != "cpu" else None)
    try:
        model.buffer.load_state_dict(ckpt.weights)
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}: the checkpoint does not match its own config "
                              f"(L{cfg.num_layers} H{cfg.num_heads} E{cfg.embed_dim}, "
                              f"V{vocab})") from None
    model.training = False
    return model, ckpt, cfg


def load_policy(cfg: Config, threads: int = 0, device: str = "cpu") -> RunPolicy:
    """How a loaded checkpoint computes on `device`: as it trained (its PRECISION and
    ATTENTION), with this machine's own CPU kernels and `threads` threads (0: all; THREADS
    and CPU_JIT were the training machine's). ATTENTION=cudnn becomes auto: the same
    attention, from cuDNN where this machine has it. PRECISION=fp8 becomes bf16 on a GPU
    without FP8 tensor cores: the same weights, their GEMMs in bf16."""
    attention = "auto" if cfg.attention == "cudnn" else cfg.attention
    precision = cfg.precision
    kind, index = parse_device(device)
    if precision == "fp8" and kind == "gpu" and not has_fp8_gemms(gpu_capability(index)):
        precision = "bf16"
    return dataclasses.replace(DEFAULT, precision=Precision.of(precision),
                               attention=attention, threads=threads)


def upload_split(backend: Any, tokens: np.ndarray, batch_size: int) -> Any:
    """A split in the LM layout (batchify on the host), moved to the device once."""
    return backend.from_host(np.ascontiguousarray(
        data.batchify(tokens.astype(np.int32), batch_size)))


def windows(tokens: int, seq_len: int, stride: int) -> list[tuple[int, int]]:
    """(start, first scored position) of each evaluation window over a row of `tokens`.

    stride 0: non-overlapping SEQ_LEN windows, every position scored. stride S: windows
    advancing S tokens; the first scores all its positions, each later one only its last S,
    so every token is scored once, with at least SEQ_LEN - S tokens of context."""
    step = stride or seq_len
    last = tokens - 1 - seq_len  # the latest start with a full window and its targets
    return [(start, 0 if start == 0 else seq_len - step)
            for start in range(0, last + 1, step)]


def protocol(seq_len: int, stride: int) -> str:
    """The evaluation protocol in words, for the log block."""
    if not stride or stride == seq_len:
        return f"non-overlapping {seq_len}-token windows"
    return f"sliding {seq_len}-token windows, stride {stride}"


def within_budget(spans: list[tuple[int, int]], rows: int, seq_len: int,
                  budget: int) -> list[tuple[int, int]]:
    """The first windows whose scored tokens (over all `rows`) stay within `budget` (at
    least one window; budget 0 = all). A prefix, so runs with the same budget compare."""
    if not budget:
        return spans
    kept, scored = [], 0
    for start, first in spans:
        scored += rows * (seq_len - first)
        if kept and scored > budget:
            break
        kept.append((start, first))
    return kept


def scored_tokens(shape: tuple[int, ...], seq_len: int, stride: int = 0,
                  budget: int = 0) -> tuple[int, int]:
    """(tokens an evaluation of a (B, N) split scores within `budget`, tokens a full one
    scores): the one token count every line about that evaluation uses."""
    rows, spans = shape[0], windows(shape[1], seq_len, stride)
    count = lambda some: rows * sum(seq_len - first for _, first in some)  # noqa: E731
    return count(within_budget(spans, rows, seq_len, budget)), count(spans)


def perplexity(model: GPT, stream: Any, seq_len: int, stride: int = 0, budget: int = 0,
               advance: Callable[[int], None] | None = None) -> dict[str, Any]:
    """exp(mean per-token NLL) over an uploaded (B, N) split, in the windows of `windows`,
    the first of them only when `budget` (tokens, 0 = all) is less than the split;
    `advance(n)` is told the tokens of each window as it is queued."""
    backend = model.buffer.backend
    spans = windows(stream.shape[1], seq_len, stride)
    if not spans:
        streams = stream.shape[0]
        raise DataError(f"split of {stream.size} tokens is too short for BATCH_SIZE={streams} "
                        f"streams of SEQ_LEN+1={seq_len + 1} tokens (at least "
                        f"{streams * (seq_len + 1)}); "
                        f"{data.layout_advice(int(stream.size), streams, seq_len)}")
    rows = stream.shape[0]
    _, full = scored_tokens(stream.shape, seq_len, stride, budget)
    xp = backend.xp
    total = xp.zeros((), dtype=np.float64)
    scored = 0
    was_training, model.training = model.training, False
    try:
        with no_grad():
            for start, first in within_budget(spans, rows, seq_len, budget):
                x = xp.ascontiguousarray(stream[:, start : start + seq_len])  # (B, T)
                y = xp.ascontiguousarray(stream[:, start + 1 : start + seq_len + 1])
                total += model(Tensor.wrap(x, backend), Tensor.wrap(y, backend),
                               score_from=first).data * (seq_len - first)
                scored += seq_len - first
                if advance is not None:
                    advance(rows * (seq_len - first))
    finally:
        model.training = was_training
    nll = float(backend.to_host(total)) / scored
    return {"perplexity": exp(nll), "nll": nll, "tokens": scored * rows, "of": full,
            "protocol": protocol(seq_len, stride)}


def per_word(nll: float, tokens: int, words: int) -> float:
    """Perplexity per word of the original text, from the mean NLL per token of a split of
    `tokens` tokens whose text has `words` words: exp(total NLL / words), the standard
    conversion that makes a subword model comparable with a word-level one (`words` counts
    as the word-level tokenizer does, <eos> included). When only some tokens were scored
    (windows, EVAL_TOKENS) the total is their mean times the split's tokens."""
    try:
        return exp(nll * tokens / words)
    except OverflowError:
        return math.inf


def with_per_word(result: dict[str, Any], corpus: data.Corpus, split: str) -> dict[str, Any]:
    """`result` of `perplexity` with `word_perplexity` added for a subword corpus."""
    if corpus.words is None:
        return result
    tokens = int(getattr(corpus, split).shape[0])
    return {**result, "word_perplexity": per_word(result["nll"], tokens, corpus.words[split]),
            "words": corpus.words[split], "split_tokens": tokens}


Status = Callable[[str, int], Any]


def evaluate_checkpoint(path: str, split: str, device: str, data_dir: str | None = None,
                        status: Status | None = None, budget: int = 0,
                        stride: int | None = None) -> dict[str, Any]:
    """`rustyflow eval`: perplexity of a checkpoint on the valid or test split (its first
    `budget` tokens; 0 = all), in windows advancing `stride` tokens (None: the checkpoint's
    EVAL_STRIDE). `status(split, tokens)` is a context manager shown while the split is
    evaluated; it yields an `advance(n)` callable (or None)."""
    model, cfg, corpus, used = open_checkpoint(path, device, data_dir)
    stride = evaluation_stride(cfg, stride)
    stream = upload_split(model.buffer.backend, getattr(corpus, split), cfg.batch_size)
    tokens, _ = scored_tokens(stream.shape, cfg.seq_len, stride, budget)
    with status(split, tokens) if status else contextlib.nullcontext() as advance:
        result = perplexity(model, stream, cfg.seq_len, stride, budget, advance)
    return {**with_per_word(result, corpus, split), "device": used, "split": split}


def evaluation_stride(cfg: Config, stride: int | None) -> int:
    """--eval-stride, else the checkpoint's EVAL_STRIDE; a ConfigError past its SEQ_LEN."""
    if stride is None:
        return cfg.eval_stride
    if stride > cfg.seq_len:
        raise ConfigError(f"--eval-stride {stride} is longer than the model's "
                          f"SEQ_LEN={cfg.seq_len}: pass 1 to {cfg.seq_len} (0: non-overlapping "
                          f"windows)")
    return stride


def open_checkpoint(path: str, device: str,
                    data_dir: str | None = None) -> tuple[GPT, Config, data.Corpus, str]:
    """(model, its config, its corpus, the device used) of a checkpoint to evaluate on
    `device` (auto, cpu, gpu), with the dataset it trained on."""
    from ...engine.backend import resolve_device

    used, _ = resolve_device(device, False, print, lambda msg: print(msg, file=sys.stderr))
    model, ckpt, cfg = load_model(path, used)
    # --data-dir, else the training run's DATA_DIR where it exists here too, else the rest
    # of the lookup order ($RUSTYFLOW_DATA_DIR, ./data, ../shared/data)
    stored = cfg.data_dir if cfg.data_dir and Path(cfg.data_dir).is_dir() else None
    tokenizer = checkpoint_tokenizer(ckpt.meta, path, "--model")
    corpus = load_corpus(cfg, data_dir or stored, lambda msg: print(msg, file=sys.stderr),
                         tokenizer)
    if list(ckpt.vocab) != corpus.vocab.itos:
        raise CheckpointError(f"{path}: its vocabulary differs from {cfg.dataset}'s: was it "
                              f"trained on another dataset?")
    return model, cfg, corpus, used


def open_session(model_path: str, device: str, strict: bool, sampling: Sampling, seed: int,
                 say: Any, warn: Any = None, samples: int = 1, threads: int = 0) -> Session:
    """Load a checkpoint (trained on either device) onto `device` (cpu, gpu or auto), to
    generate `samples` sequences at once (on the CPU with `threads` threads, 0: all)."""
    from ...engine.backend import resolve_device

    used, _ = resolve_device(device, strict, say, warn or say)
    model, ckpt, _ = load_model(model_path, used, threads)
    tokenizer = checkpoint_tokenizer(ckpt.meta, model_path, "--model")
    text = Vocab.from_array(ckpt.vocab) if tokenizer is None else SubwordText(tokenizer)
    session = Session(model, text, sampling, seed, batch=samples, warn=warn or say)
    session.path = model_path
    return session


class SplitEvaluator:
    """Perplexity of a run's model on its valid/test splits, each uploaded once (on first use),
    on at most `budget` tokens of each (0 = all). `set_aside()` wraps the uploads and
    read-backs so they are not counted as step traffic. `counts[split]` is (tokens scored,
    tokens a full evaluation scores) of the last evaluation of that split."""

    def __init__(self, model: GPT, corpus: data.Corpus, batch_size: int, seq_len: int,
                 stride: int, progress: Any, set_aside: Callable[[], Any],
                 budget: int = 0) -> None:
        self.model, self.corpus, self.batch_size, self.seq_len = model, corpus, batch_size, seq_len
        self.stride, self.budget = stride, budget
        self.progress, self.set_aside = progress, set_aside
        self.streams: dict[str, Any] = {}
        self.counts: dict[str, tuple[int, int]] = {}
        self.word_ppl: dict[str, float] = {}  # a subword corpus's last perplexity per word

    def __call__(self, split: str) -> float:
        with self.set_aside():
            if split not in self.streams:
                self.streams[split] = upload_split(self.model.buffer.backend,
                                                   getattr(self.corpus, split), self.batch_size)
            stream = self.streams[split]
            tokens, _ = scored_tokens(stream.shape, self.seq_len, self.stride, self.budget)
            status = (self.progress.evaluating(split, tokens) if self.progress
                      else contextlib.nullcontext())
            with status as advance:
                result = perplexity(self.model, stream, self.seq_len, self.stride,
                                    self.budget, advance)
            self.counts[split] = (result["tokens"], result["of"])
            result = with_per_word(result, self.corpus, split)
            if "word_perplexity" in result:
                self.word_ppl[split] = result["word_perplexity"]
            return result["perplexity"]

    def on(self, split: str) -> str:
        """` on <on_tokens>` of the split's last evaluation ("" before there was one)."""
        if split not in self.counts:
            return ""
        word = (f" ({self.word_ppl[split]:.2f} per word of the text)"
                if split in self.word_ppl else "")
        return f" on {on_tokens(*self.counts[split])}{word}"


def exp(nll: float) -> float:
    """e**nll, inf where that overflows a float (a diverged model's perplexity is not a
    number to compute, but inf: the run then ends failed, as for nan)."""
    return math.exp(nll) if nll < MAX_EXP else math.inf


MAX_EXP = math.log(sys.float_info.max)
