"""A fingerprint of the token stream a run trains on, stored in its checkpoints.

A resume on other data (a line of the training text changed, a dataset folder without its
checksum file) would continue silently from a position in a different stream. The tokens
themselves are what the model learns from, so they are what is hashed: the train split's ids
as little-endian int32, with their count. One SHA-256 pass over a WikiText-2-size split costs
little next to reading and tokenizing it, so every run can afford it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def fingerprint(tokens: np.ndarray) -> dict[str, Any]:
    """The fingerprint of a training split's token ids: their count and SHA-256."""
    ids = np.ascontiguousarray(tokens, dtype="<i4")
    return {"train_tokens": int(ids.size), "train_sha256": hashlib.sha256(ids.data).hexdigest()}


def describe(data: dict[str, Any]) -> str:
    """A fingerprint in words: '2,088,628 tokens, sha256 1f3a9c0d2b4e5f60'."""
    return f"{data['train_tokens']:,} tokens, sha256 {str(data['train_sha256'])[:16]}"


def same(stored: Any, current: dict[str, Any]) -> bool | None:
    """Whether a checkpoint's stored fingerprint is `current`'s; None when it stores none (a
    checkpoint from before fingerprints, or a damaged one)."""
    if not isinstance(stored, dict) or not {"train_tokens", "train_sha256"} <= stored.keys():
        return None
    return (stored["train_tokens"], stored["train_sha256"]) == (current["train_tokens"],
                                                                current["train_sha256"])
