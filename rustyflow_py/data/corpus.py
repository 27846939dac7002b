"""A tokenized dataset (Corpus) made from verified text: official splits, or one text cut 90/10."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from .vocab import Vocab, tokenize

VALID_FRACTION = 0.1  # held-out share for datasets without official splits


@dataclass
class Corpus:
    """A tokenized dataset. When the dataset has no official test split, `test_is_valid` is
    True and `test` is the same array as `valid` (a 90/10 split of the token stream)."""

    name: str
    vocab: Vocab
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    source: str
    test_is_valid: bool = False
    # a subword corpus: the words of each split's text (per-word perplexity divides by them)
    # and its tokenizer (also its `vocab`); None for words
    words: dict[str, int] | None = None
    tokenizer: Any = None


def read_text(path: Path, data: bytes | None = None) -> str:
    """Decode a file as UTF-8 (no BOM, '\\r\\n' -> '\\n'); DataError names the bad byte."""
    raw = path.read_bytes() if data is None else data
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise DataError(f"{path} is not UTF-8 text: byte 0x{raw[err.start]:02x} at offset "
                        f"{err.start} (line {line}); convert it first, e.g. "
                        f"`iconv -f latin1 -t utf-8`") from None
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def corpus_from_splits(name: str, texts: dict[str, str], source: str) -> Corpus:
    """Corpus from train/valid/test texts; the vocabulary comes from train alone."""
    train = tokenize(texts["train"])
    vocab = Vocab.build(train)
    return Corpus(name, vocab, vocab.encode(train), vocab.encode(tokenize(texts["valid"])),
                  vocab.encode(tokenize(texts["test"])), source)


def word_count(text: str) -> int:
    """len(tokenize(text)) without building the list: whitespace words plus one <eos> per line."""
    return len(text.split()) + text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def split_text(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """`text` cut where corpus_from_text cuts its word tokens 90/10: ((training text, its
    words), (validation text, its words)), so a subword corpus validates on exactly the
    words a word-level one does. The word counts are the word-level token counts."""
    starts = [m.start() for m in re.finditer(r"\S+|\n", text)]
    if text and not text.endswith("\n"):
        starts.append(len(text))  # the last line's <eos>
    cut = round(len(starts) * (1 - VALID_FRACTION))
    if cut < 2 or len(starts) - cut < 2:
        raise DataError(f"the text has only {len(starts)} tokens: too few to split 90/10 into "
                        f"training and validation text")
    return (text[: starts[cut]], cut), (text[starts[cut]:], len(starts) - cut)


def corpus_from_text(name: str, text: str, source: str) -> Corpus:
    """Corpus from one text: the token stream is split 90/10 into train/valid, test = valid.

    The vocabulary covers the whole text, so validation words always have an id.
    """
    tokens = tokenize(text)
    cut = round(len(tokens) * (1 - VALID_FRACTION))
    if cut < 2 or len(tokens) - cut < 2:
        raise DataError(f"{source} has only {len(tokens)} tokens: too few to split 90/10 into "
                        f"training and validation text")
    vocab = Vocab.build(tokens)
    ids = vocab.encode(tokens)
    valid = ids[cut:]
    return Corpus(name, vocab, ids[:cut], valid, valid, source, test_is_valid=True)
