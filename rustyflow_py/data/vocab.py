"""Word-level tokens: whitespace words with an end-of-line token, and the word <-> id tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from ..errors import DataError

EOS = "<eos>"
UNK = "<unk>"


def tokenize(text: str) -> list[str]:
    """Whitespace tokens with <eos> after every line (a blank line is just <eos>)."""
    tokens = text.replace("\n", f" {EOS} ").split()
    if text and not text.endswith("\n"):  # the last line ends without a newline
        tokens.append(EOS)
    return tokens


class Vocab:
    """Word <-> id tables; ids follow first appearance, the WikiText-2 convention."""

    def __init__(self, itos: Iterable[str]) -> None:
        self.itos: list[str] = list(itos)
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise DataError("vocabulary has duplicate words: the checkpoint is damaged")

    @classmethod
    def build(cls, tokens: Iterable[str]) -> Vocab:
        """Vocabulary of `tokens` in first-appearance order."""
        return cls(dict.fromkeys(tokens))

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def unk_id(self) -> int | None:
        """Id of <unk> (unknown words map to it), or None when the vocabulary has none."""
        return self.stoi.get(UNK)

    @property
    def eos_id(self) -> int | None:
        """Id of <eos>, the end-of-line token, or None when the vocabulary has none."""
        return self.stoi.get(EOS)

    def encode(self, words: Sequence[str]) -> np.ndarray:
        """int32 ids; unknown words become <unk>, or a DataError when there is no <unk>."""
        ids = np.fromiter(map(self.stoi.get, words, repeat(-1)), np.int32, count=len(words))
        missing = np.flatnonzero(ids < 0)
        if missing.size:
            if self.unk_id is None:
                first = int(missing[0])
                raise DataError(f"word {words[first]!r} (token {first}) is not in the "
                                f"vocabulary, which has no {UNK} to stand for it")
            ids[missing] = self.unk_id
        return ids

    def decode(self, ids: Any) -> list[str]:
        """Words of a sequence of ids (a list, NumPy or CuPy array)."""
        return [self.itos[i] for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]

    def to_array(self) -> np.ndarray:
        """The words as a fixed-width str array, storable in .npz without pickle."""
        return np.array(self.itos, dtype=np.str_)

    @classmethod
    def from_array(cls, array: np.ndarray) -> Vocab:
        """Inverse of to_array."""
        return cls(str(w) for w in array.tolist())
