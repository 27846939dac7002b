"""`train --init-from CKPT`: start a new run from a checkpoint's weights (fine-tuning).

Unlike --resume, nothing of the old run continues: the optimizer, the schedule, the step
count and the run id are new. Only the weights come, so the model's shape (layers, heads,
width) is the checkpoint's, and its vocabulary must be the run's token for token: a weight
row means the token at its index, and a run that reads other tokens would train on rows that
mean something else. The position table may be cut to a shorter SEQ_LEN (its first rows are
the positions a shorter window uses), never lengthened.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import CheckpointError, ConfigError
from ..config.config import KEYS
from ..outputs.checkpoint import Checkpoint, validate_against
from ..outputs.ownership import checkpoint_meta

FLAG = "--init-from"
SHAPE = ("NUM_LAYERS", "NUM_HEADS", "EMBED_DIM")


def load(path: str) -> Checkpoint:
    return Checkpoint(path, flag=FLAG)


def shape_overrides(path: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The command line's overrides (attr -> value, None = not given) with the model shape of
    the checkpoint at `path` filled in (read from its meta alone, not its weights); a flag
    that asks for another shape is a ConfigError."""
    meta = checkpoint_meta(path)
    if meta is None or not isinstance(meta.get("config"), dict):
        load(path).config  # noqa: B018 - raises the CheckpointError that says what is wrong
        raise CheckpointError(f"{FLAG} {path}: the checkpoint stores no run configuration")
    stored = meta["config"]
    merged = dict(overrides)
    for name in SHAPE:
        attr, value = KEYS[name].attr, stored.get(name)
        given = overrides.get(attr)
        if given is not None and str(given) != str(value):
            raise ConfigError(f"{KEYS[name].flag} {given} contradicts {FLAG} {path}, whose "
                              f"model has {name}={value}: the model's shape comes from the "
                              f"checkpoint; drop {KEYS[name].flag}")
        merged[attr] = value
    return merged


def check_vocab(ckpt: Checkpoint, run_vocab: Sequence[str], what: str) -> None:
    """CheckpointError unless the checkpoint's vocabulary is the run's (`what` says whose:
    the dataset's words, a tokenizer's tokens)."""
    ours = [str(t) for t in ckpt.vocab]
    if len(ours) != len(run_vocab):
        imported = (ckpt.meta.get("imported") or {}).get("tokenizer")
        kind = f" (tokenizer {imported})" if imported else ""
        raise CheckpointError(
            f"{FLAG} {ckpt.path}: its vocabulary has {len(ours):,} tokens{kind}, this run's "
            f"({what}) has {len(run_vocab):,}: its embedding rows would mean other tokens; "
            f"train with the tokenizer and data the checkpoint was made with")
    differ = next((i for i, (a, b) in enumerate(zip(ours, run_vocab, strict=True)) if a != b), None)
    if differ is not None:
        raise CheckpointError(
            f"{FLAG} {ckpt.path}: its vocabulary and this run's ({what}) both have "
            f"{len(ours):,} tokens, but differ from id {differ} on ({ours[differ]!r} vs "
            f"{run_vocab[differ]!r}): train with the tokenizer and data the checkpoint was "
            f"made with")


def initialize(ckpt: Checkpoint, buffer: Any, seq_len: int, run_vocab: Sequence[str],
               what: str, say: Callable[[str], None]) -> None:
    """Load the checkpoint's weights into the run's parameter buffer, after checking them."""
    check_vocab(ckpt, run_vocab, what)
    weights = dict(ckpt.weights)
    positions = weights["wpe"].shape[0] if "wpe" in weights else seq_len
    if seq_len > positions:
        raise CheckpointError(f"{FLAG} {ckpt.path}: SEQ_LEN={seq_len} needs {seq_len} "
                              f"positions, the checkpoint's model has {positions}: set SEQ_LEN "
                              f"to at most {positions}")
    if seq_len < positions:
        weights["wpe"] = np.ascontiguousarray(weights["wpe"][:seq_len])
        say(f"note: {FLAG}: using the first {seq_len} of the checkpoint's {positions} "
            f"positions (SEQ_LEN={seq_len})")
    ckpt.weights = weights
    validate_against(ckpt, buffer.shapes(), None, FLAG)
    buffer.load_state_dict({k: weights[k] for k in buffer.shapes()})
    say(f"Initialised from {ckpt.path} (weights only; a new optimizer and schedule)")
