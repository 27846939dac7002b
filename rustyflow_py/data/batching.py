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


def layout_advice(tokens: int, batch_size: int, seq_len: int) -> str:
    """Concrete settings under which `tokens` fill one window per stream, for error messages."""
    fixes = []
    if tokens // (seq_len + 1) >= 1:
        fixes.append(f"BATCH_SIZE={tokens // (seq_len + 1)} or less (at SEQ_LEN={seq_len})")
    if tokens // batch_size - 1 >= 1:
        fixes.append(f"SEQ_LEN={tokens // batch_size - 1} or less (at BATCH_SIZE={batch_size})")
    if not fixes and tokens >= 2:
        fixes.append(f"BATCH_SIZE=1 with SEQ_LEN={tokens - 1} or less")
    return "use " + ", or ".join([*fixes, "more text"])


def check_layout(corpus: Corpus, batch_size: int, seq_len: int, shifted: bool = False) -> None:
    """DataError unless every split fills one window of seq_len + 1 tokens per stream.

    Each split is cut into `batch_size` contiguous streams (batchify) and read in windows of
    seq_len + 1 tokens (inputs plus shifted targets). Checking all splits before the first
    step turns a validation split that is too short into an error now, not after an epoch.
    shifted (RANDOM_OFFSETS): the training split also needs room for an offset of up to
    seq_len - 1 tokens before its first window.
    """
    tokens = int(corpus.train.shape[0])
    if shifted and tokens // batch_size < 2 * seq_len:
        raise DataError(
            f"{corpus.name}: RANDOM_OFFSETS=true needs at least 2*SEQ_LEN={2 * seq_len} "
            f"training tokens per stream (a window after an offset of up to SEQ_LEN-1), but "
            f"BATCH_SIZE={batch_size} streams have {tokens // batch_size} each; use "
            f"RANDOM_OFFSETS=false, BATCH_SIZE={max(1, tokens // (2 * seq_len))} or less, or "
            f"SEQ_LEN={max(1, tokens // batch_size // 2)} or less")
    need = batch_size * (seq_len + 1)
    sizes = {split: int(getattr(corpus, split).shape[0]) for split in SPLITS
             if not (split == "test" and corpus.test_is_valid)}
    short = [f"the {split} split has {n} tokens" for split, n in sizes.items() if n < need]
    if short:
        raise DataError(
            f"{corpus.name}: {' and '.join(short)}, too few for BATCH_SIZE={batch_size} streams "
            f"of SEQ_LEN+1={seq_len + 1} tokens (at least {need} tokens per split); "
            f"{layout_advice(min(sizes.values()), batch_size, seq_len)}")
