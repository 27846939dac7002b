"""The standard language-model layout: a token stream cut into BATCH_SIZE contiguous rows, read
in consecutive SEQ_LEN windows whose targets are the inputs shifted one token ahead.

Only slicing and reshape on the token arrays, so NumPy and CuPy arrays both work unchanged.
"""

from __future__ import annotations

from typing import Any

from ..errors import DataError
from .corpus import Corpus
from .registry import SPLITS


def batchify(tokens: Any, batch_size: int) -> Any:
    """Split a 1-D token stream into `batch_size` contiguous rows (B, N), dropping the rest."""
    n = tokens.shape[0] // batch_size
    if n < 2:
        raise DataError(f"{tokens.shape[0]} tokens cannot fill {batch_size} streams of at "
                        f"least 2 tokens: use a smaller BATCH_SIZE or more text")
    return tokens[: n * batch_size].reshape(batch_size, n)


def num_batches(stream: Any, seq_len: int, partial: bool = False, shifted: bool = False) -> int:
    """Windows per pass: full ones need seq_len + 1 tokens (inputs plus shifted targets).

    partial=True also counts a shorter last window, so evaluation covers every token.
    shifted=True (RANDOM_OFFSETS) counts the windows that fit after an offset of up to
    seq_len - 1 tokens, the most an epoch may start each row at.
    """
    usable = stream.shape[1] - 1 - (seq_len - 1 if shifted else 0)
    return -(-usable // seq_len) if partial else usable // seq_len


def get_batch(stream: Any, i: int, seq_len: int, partial: bool = False) -> tuple[Any, Any]:
    """Window i as (x, y) views of shape (B, T): y is x shifted one token ahead."""
    if not 0 <= i < num_batches(stream, seq_len, partial):
        raise IndexError(f"batch {i} out of range: {num_batches(stream, seq_len, partial)} "
                         f"windows of {seq_len} tokens")
    start = i * seq_len
    end = min(start + seq_len, stream.shape[1] - 1)
    return stream[:, start:end], stream[:, start + 1: end + 1]


def streams_of(batch_size: int, accum: int = 1, processes: int = 1) -> str:
    """The streams of one optimizer step in the settings that make them, for messages:
    `BATCH_SIZE=4`, or `BATCH_SIZE=4 x GRAD_ACCUM_STEPS=2 x 2 processes = 16`."""
    parts = [f"BATCH_SIZE={batch_size}", *([f"GRAD_ACCUM_STEPS={accum}"] if accum > 1 else []),
             *([f"{processes} processes"] if processes > 1 else [])]
    total = f" = {batch_size * accum * processes}" if len(parts) > 1 else ""
    return " x ".join(parts) + total


def layout_advice(tokens: int, batch_size: int, seq_len: int) -> str:
    """Concrete settings under which `tokens` fill one window per stream, for error messages."""
    return _advice({"split": tokens}, batch_size, seq_len)


def _advice(sizes: dict[str, int], batch_size: int, seq_len: int, accum: int = 1,
            processes: int = 1) -> str:
    """Settings under which every split of `sizes` fills one window per stream: the train
    split is read as a step's BATCH_SIZE x GRAD_ACCUM_STEPS x processes streams, the others
    as BATCH_SIZE streams. GRAD_ACCUM_STEPS is advised only when it alone is the cause."""
    per = {split: accum * processes if split == "train" else 1 for split in sizes}
    fixes = []
    batch = min(n // (seq_len + 1) // per[split] for split, n in sizes.items())
    if batch >= 1:
        fixes.append(f"BATCH_SIZE={batch} or less (at SEQ_LEN={seq_len})")
    seq = min(n // (batch_size * per[split]) for split, n in sizes.items()) - 1
    if seq >= 1:
        fixes.append(f"SEQ_LEN={seq} or less (at BATCH_SIZE={batch_size})")
    if accum > 1 and list(sizes) == ["train"]:
        steps = sizes["train"] // (seq_len + 1) // (batch_size * processes)
        if steps >= 1:
            fixes.append(f"GRAD_ACCUM_STEPS={steps} or less")
    longest = min(n // per[split] for split, n in sizes.items()) - 1  # at BATCH_SIZE=1
    if not fixes and longest >= 1:
        fixes.append(f"BATCH_SIZE=1 with SEQ_LEN={longest} or less")
    return "use " + ", or ".join([*fixes, "more text"])


def check_layout(corpus: Corpus, batch_size: int, seq_len: int, shifted: bool = False,
                 accum: int = 1, processes: int = 1) -> None:
    """DataError unless every split fills one window of seq_len + 1 tokens per stream.

    The training split is cut into the streams of one optimizer step (batchify): BATCH_SIZE
    x GRAD_ACCUM_STEPS (`accum`) x `processes`; validation and test into BATCH_SIZE streams,
    as evaluation reads them. Each is read in windows of seq_len + 1 tokens (inputs plus
    shifted targets). Checking all splits before the first step turns a validation split
    that is too short into an error now, not after an epoch, and the message names the keys
    the user sets, never the product of them. shifted (RANDOM_OFFSETS): the training split
    also needs room for an offset of up to seq_len - 1 tokens before its first window.
    """
    tokens, per = int(corpus.train.shape[0]), accum * processes
    streams = batch_size * per
    if shifted and tokens // streams < 2 * seq_len:
        steps = tokens // (2 * seq_len) // (batch_size * processes)
        fewer = f", GRAD_ACCUM_STEPS={steps} or less" if accum > 1 and steps >= 1 else ""
        raise DataError(
            f"{corpus.name}: RANDOM_OFFSETS=true needs at least 2*SEQ_LEN={2 * seq_len} "
            f"training tokens per stream (a window after an offset of up to SEQ_LEN-1), but "
            f"{streams_of(batch_size, accum, processes)} streams have {tokens // streams} "
            f"each; use RANDOM_OFFSETS=false, BATCH_SIZE="
            f"{max(1, tokens // (2 * seq_len) // per)} or less{fewer}, or "
            f"SEQ_LEN={max(1, tokens // streams // 2)} or less")
    rows = {split: batch_size * (per if split == "train" else 1) for split in SPLITS
            if not (split == "test" and corpus.test_is_valid)}
    sizes = {split: int(getattr(corpus, split).shape[0]) for split in rows}
    short = {split: n for split, n in sizes.items() if n < rows[split] * (seq_len + 1)}
    if short:
        groups: dict[int, list[str]] = {}
        for split in short:
            groups.setdefault(rows[split], []).append(split)
        clauses = []
        for count, splits in groups.items():
            has = " and ".join(f"the {split} split has {short[split]} tokens" for split in splits)
            each = " per split" if len(splits) > 1 else ""
            who = (streams_of(batch_size, accum, processes) if "train" in splits
                   else streams_of(batch_size))
            clauses.append(f"{has}, too few for {who} streams of SEQ_LEN+1={seq_len + 1} "
                           f"tokens (at least {count * (seq_len + 1)} tokens{each})")
        raise DataError(f"{corpus.name}: {', and '.join(clauses)}; "
                        f"{_advice(short, batch_size, seq_len, accum, processes)}")
