"""Checkpoints: one .npz (no pickle) with weights, config, vocabulary and training state.

Keys: `param/<name>` weights; `opt/<name>` optimizer state; `meta` a JSON string (config,
step, epoch, data position, RNG state, format version); `vocab` the vocabulary as strings.
Written to a temp file in the same directory and renamed over the target, so a crash never
leaves a half-written checkpoint where a good one was.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CheckpointError

FORMAT_VERSION = 1


def save(
    path: str | os.PathLike[str],
    weights: dict[str, np.ndarray],
    meta: dict[str, Any],
    vocab: np.ndarray,
    optimizer: dict[str, np.ndarray] | None = None,
) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"param/{k}": v for k, v in weights.items()}
    arrays.update({f"opt/{k}": v for k, v in (optimizer or {}).items()})
    arrays["meta"] = np.array(json.dumps({**meta, "format_version": FORMAT_VERSION}))
    arrays["vocab"] = vocab
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


class Checkpoint:
    """A loaded checkpoint: weights, optimizer state, meta (JSON) and vocabulary."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"checkpoint not found: {self.path}")
        try:
            with np.load(self.path, allow_pickle=False) as z:
                files = {k: z[k] for k in z.files}
            self.meta: dict[str, Any] = json.loads(str(files.pop("meta")))
            self.vocab: np.ndarray = files.pop("vocab")
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise CheckpointError(
                f"{self.path} is not a readable RustyFlow checkpoint ({type(exc).__name__}: "
                f"{exc}); re-train or point --model at another file"
            ) from exc
        if self.meta.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"{self.path}: checkpoint format {self.meta.get('format_version')} is not "
                f"supported (expected {FORMAT_VERSION})"
            )
        self.weights = {k[6:]: v for k, v in files.items() if k.startswith("param/")}
        self.optimizer = {k[4:]: v for k, v in files.items() if k.startswith("opt/")}

    @property
    def config(self) -> dict[str, Any]:
        if not isinstance(self.meta.get("config"), dict):
            raise CheckpointError(f"{self.path}: the checkpoint stores no run configuration; "
                                  "it was not written by `rustyflow train`")
        return self.meta["config"]
