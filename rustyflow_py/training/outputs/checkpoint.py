"""Checkpoints: one .npz (no pickle) with weights, config, vocabulary and training state.

Keys: `param/<name>` weights; `opt/<name>` optimizer state; `avg/<name>` the weight
average's state (EMA_DECAY, AVERAGE_LAST_K); `meta` a JSON string (config,
step, epoch, data position, RNG state, format version); `vocab` the vocabulary as strings.
Written to a temp file in the same directory and renamed over the target, so a crash never
leaves a half-written checkpoint where a good one was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CheckpointError
from . import npz
from .writing import write_atomically

FORMAT_VERSION = 1
WRITER = "rustyflow"  # in every checkpoint's meta: the mark that it is rustyflow's to replace


def save(
    path: str | os.PathLike[str],
    weights: dict[str, np.ndarray],
    meta: dict[str, Any],
    vocab: np.ndarray,
    optimizer: dict[str, np.ndarray] | None = None,
    averages: dict[str, np.ndarray] | None = None,
) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"param/{k}": v for k, v in weights.items()}
    arrays.update({f"opt/{k}": v for k, v in (optimizer or {}).items()})
    arrays.update({f"avg/{k}": v for k, v in (averages or {}).items()})
    arrays["meta"] = np.array(json.dumps({**meta, "format_version": FORMAT_VERSION,
                                              "writer": WRITER}))
    arrays["vocab"] = vocab
    return write_atomically(target, lambda f: np.savez(f, **arrays))


def _not_ours(path: Path, reason: str, flag: str) -> CheckpointError:
    return CheckpointError(f"{path} is not a readable RustyFlow checkpoint (.npz written by "
                           f"`rustyflow train`): {reason}; pass another file to {flag}")


def _read_arrays(path: Path, flag: str) -> dict[str, Any]:
    """Every member of the .npz, each size checked before it is allocated (npz.read)."""
    try:
        return npz.read(path)
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read ({exc.strerror}); pass another file to "
                              f"{flag}") from None
    except npz.NpzError as exc:
        raise _not_ours(path, str(exc), flag) from None


def nonfinite(arrays: dict[str, np.ndarray]) -> tuple[str, int] | None:
    """The first array (in dict order) holding nan/inf and how many such values it has; None
    when all are finite.

    One pass per float array: its sum is finite exactly when every value is (a nan or inf
    carries into the sum), unless finite values overflow it; only then are values counted."""
    with np.errstate(over="ignore", invalid="ignore"):
        for name, a in arrays.items():
            if a.dtype.kind != "f":
                continue  # integers are always finite
            if np.isfinite(a.sum(dtype=np.promote_types(a.dtype, np.float32))):
                continue
            bad = a.size - int(np.count_nonzero(np.isfinite(a)))
            if bad:
                return name, bad
    return None


def _parse_meta(files: dict[str, Any], path: Path, flag: str) -> dict[str, Any]:
    """The `meta` member as a dict; a CheckpointError when absent or not a JSON object."""
    if "meta" not in files:
        raise _not_ours(path, "it has no 'meta' entry (configuration and training state)", flag)
    try:
        meta = json.loads(str(files["meta"]))
    except ValueError:
        raise _not_ours(path, "its 'meta' entry is not JSON", flag) from None
    if not isinstance(meta, dict):
        raise _not_ours(path, "its 'meta' entry is not a JSON object", flag)
    return meta


def _parse_vocab(files: dict[str, Any], path: Path, flag: str) -> np.ndarray:
    """The `vocab` member: a 1-D array of words."""
    vocab = files.get("vocab")
    if vocab is None:
        raise _not_ours(path, "it has no 'vocab' entry (the vocabulary)", flag)
    if not isinstance(vocab, np.ndarray) or vocab.ndim != 1 or vocab.dtype.kind != "U":
        raise _not_ours(path, "its 'vocab' entry is not a list of words", flag)
    return vocab


def _members(files: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}


class Checkpoint:
    """A loaded checkpoint: weights, optimizer state, meta (JSON) and vocabulary.

    `flag` is the option the path came from (--model, --resume): every error names it, so the
    user knows which argument to change.
    """

    def __init__(self, path: str | os.PathLike[str], *, flag: str = "--model") -> None:
        self.path, self.flag = Path(path), flag
        if not self.path.is_file():
            raise CheckpointError(f"checkpoint not found: {self.path}; pass an existing file "
                                  f"to {flag}")
        files = _read_arrays(self.path, flag)
        self.meta: dict[str, Any] = _parse_meta(files, self.path, flag)
        if self.meta.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"{self.path}: checkpoint format {self.meta.get('format_version')} is not "
                f"supported (expected {FORMAT_VERSION}); pass another file to {flag}"
            )
        self.vocab: np.ndarray = _parse_vocab(files, self.path, flag)
        self.weights: dict[str, np.ndarray] = _members(files, "param/")
        self.optimizer: dict[str, np.ndarray] = _members(files, "opt/")
        self.averages: dict[str, np.ndarray] = _members(files, "avg/")
        if not self.weights:
            raise _not_ours(self.path, "it holds no weights (no param/ arrays)", flag)
        odd = next((k for k, v in {**self.weights, **self.optimizer,
                                   **self.averages}.items()
                    if not isinstance(v, np.ndarray) or v.dtype.kind not in "fiu"), None)
        if odd is not None:
            raise _not_ours(self.path, f"its array {odd!r} is not numeric", flag)
        self._check_finite()

    def _check_finite(self) -> None:
        """A CheckpointError when a weight (or a weight average) is nan or inf: such a model
        scores nan and generates nothing, and training from it fails at its first step."""
        arrays = {**self.weights, **{f"avg/{k}": v for k, v in self.averages.items()}}
        found = nonfinite(arrays)
        if found is not None:
            name, count = found
            raise CheckpointError(
                f"{self.path}: tensor {name} holds {count:,} non-finite "
                f"value{'s' if count > 1 else ''} (nan/inf) of {arrays[name].size:,}: the "
                f"model diverged or the file is damaged; pass another checkpoint to "
                f"{self.flag}")

    @property
    def config(self) -> dict[str, Any]:
        if not isinstance(self.meta.get("config"), dict):
            raise CheckpointError(f"{self.path}: the checkpoint stores no run configuration; "
                                  f"it was not written by `rustyflow train`; pass another "
                                  f"file to {self.flag}")
        return self.meta["config"]


def validate_against(ckpt: Checkpoint, shapes: dict[str, tuple[int, ...]],
                     optimizer_sizes: dict[str, int] | None, flag: str) -> None:
    """CheckpointError naming the first tensor or optimizer array that does not fit the model.

    Loading copies arrays into flat buffers where a wrong size can fail deep inside NumPy, or
    (a 1-element optimizer array) broadcast silently; checking first gives one clear message.
    `optimizer_sizes` maps each optimizer state (m, v, step_count, ...) to its element count;
    None skips the optimizer.
    """
    where = f"{flag} {ckpt.path}"
    for name, shape in shapes.items():
        if name not in ckpt.weights:
            raise CheckpointError(f"{where}: the checkpoint lacks the tensor {name} (shape "
                                  f"{tuple(shape)}): it is damaged or belongs to another model")
        got = tuple(ckpt.weights[name].shape)
        if got != tuple(shape):
            raise CheckpointError(f"{where}: tensor {name} has shape {got}, this model needs "
                                  f"{tuple(shape)}: the checkpoint belongs to another model "
                                  f"configuration")
    if optimizer_sizes is not None:
        _validate_optimizer(ckpt, optimizer_sizes, where)


def _validate_optimizer(ckpt: Checkpoint, sizes: dict[str, int], where: str) -> None:
    if not ckpt.optimizer:
        raise CheckpointError(f"{where}: the checkpoint holds no optimizer state, so training "
                              f"cannot continue from it exactly")
    for name, size in sizes.items():
        state = ckpt.optimizer.get(name)
        if state is None:
            raise CheckpointError(f"{where}: the checkpoint lacks optimizer state {name!r}: "
                                  f"saved with another OPTIMIZER?")
        if state.size != size:
            raise CheckpointError(f"{where}: optimizer state {name!r} has {state.size} values, "
                                  f"this model needs {size}: the checkpoint is damaged or "
                                  f"belongs to another model")
