"""Whether a corpus can train a model at all, checked before anything is built: its training
split has words to tell apart, and every split fills the batch layout of the run's settings.

A training text of one word ("a a a ...", each line ended by the end-of-line token) trains to
a perplexity near 1 and reports "completed": the run learned nothing a user wanted, so it is
an error before the model is built, not a result.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import DataError
from .batching import check_layout
from .corpus import Corpus
from .vocab import EOS

MIN_WORDS = 2  # fewer distinct words than this leave the model nothing to tell apart


class Layout(Protocol):
    """The settings that shape a training step's batch (a run's `Config` has them)."""

    batch_size: int
    seq_len: int
    grad_accum_steps: int
    random_offsets: bool


def distinct_words(corpus: Corpus, most: int) -> list[str]:
    """Up to `most` distinct words of the training split, as its tokens spell them: for words,
    every token but the end-of-line one; for subwords, the whitespace-separated pieces of the
    tokens' bytes (a line-end or space token is no word, " a" and "a" are one)."""
    found: dict[str | bytes, None] = {}
    for token in np.flatnonzero(np.bincount(corpus.train)).tolist():
        if corpus.tokenizer is None:
            word = corpus.vocab.itos[token]
            pieces: list[str | bytes] = [] if word == EOS else [word]
        else:
            pieces = list(corpus.tokenizer.token_bytes(token).split())
        found.update(dict.fromkeys(pieces))
        if len(found) >= most:
            break
    return [w.decode("utf-8", "replace") if isinstance(w, bytes) else w for w in found][:most]


def check_words(corpus: Corpus) -> None:
    """DataError unless the training split holds at least MIN_WORDS distinct words."""
    words = distinct_words(corpus, MIN_WORDS)
    if len(words) >= MIN_WORDS:
        return
    part = ("the training text (its first 90%)" if corpus.test_is_valid
            else "the train split")
    has = (f"1 distinct word ({words[0][:40]!r}) besides line ends" if words
           else "no word at all, only line ends")
    raise DataError(f"{corpus.source}: {part} has {has}: there is nothing to learn; set "
                    f"DATASET to a text of at least {MIN_WORDS} distinct words")


def check_trainable(corpus: Corpus, layout: Layout, processes: int = 1) -> None:
    """DataError unless `corpus` can train a model in `layout` over `processes` processes:
    words to learn (check_words), and every split fills its windows (check_layout)."""
    check_words(corpus)
    check_layout(corpus, layout.batch_size, layout.seq_len, shifted=layout.random_offsets,
                 accum=layout.grad_accum_steps, processes=processes)
