"""Whose file is it? A run writes only files that are its own, or rustyflow's and meant to be
replaced.

Every file rustyflow writes carries its mark: a checkpoint's `meta` entry (format version,
writer, run id), a log's `=== RustyFlow run` block headers, a trace's `producer` field, a
lock file's first line. Before a run starts, each output path it will write is checked: one
that exists without the mark is someone else's file, and the run stops naming it; a checkpoint
of a *different* run (another run id) is replaced only with `--overwrite` (a resumed run
carries its checkpoint's run id, so it replaces its own files as before). The paths must also
be distinct: a trace written over the log would destroy the log.
"""

from __future__ import annotations

import json
import os
import re
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TrainingError
from ..reporting.record_schema import BLOCK_START
from .checkpoint import WRITER
from .config import KEYS

TRACE_MARK = b'"producer":"rustyflow train --trace"'
_SNIFF = 1 << 16  # bytes read to find a mark: marks sit at a file's start (or a trace's end)


def new_run_id() -> str:
    """A fresh run id: stored in every checkpoint the run writes, kept by --resume."""
    return uuid.uuid4().hex


def checkpoint_meta(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A rustyflow checkpoint's `meta` (read without loading its arrays), or None when the
    file is not one (another program's .npz, text, a damaged archive)."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                return None
        with np.load(path, allow_pickle=False) as z:
            if "meta" not in z.files:
                return None
            meta = json.loads(str(z["meta"]))
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    ours = isinstance(meta, dict) and (meta.get("writer") == WRITER or "format_version" in meta)
    return meta if ours else None


def run_id_of(meta: dict[str, Any] | None) -> str | None:
    """The run id a checkpoint's meta records (None: written before run ids existed)."""
    train = (meta or {}).get("train")
    run_id = train.get("run_id") if isinstance(train, dict) else None
    return run_id if isinstance(run_id, str) else None


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(_SNIFF)


def _tail(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - _SNIFF))
        return f.read()


def is_log(path: Path) -> bool:
    """An empty file, or one holding rustyflow run blocks (the log is append-only)."""
    head = _head(path)
    return not head.strip() or BLOCK_START.encode() in head


def is_trace(path: Path) -> bool:
    return TRACE_MARK in _tail(path)


def foreign(path: str, what: str, owned: Callable[[Path], bool], fix: str) -> None:
    """TrainingError when `path` exists and `owned` says rustyflow did not write it."""
    target = Path(path)
    if not target.is_file():
        return
    try:
        mine = owned(target)
    except OSError as exc:
        raise TrainingError(f"cannot read the existing {what} {path} ({exc.strerror}) to "
                            f"check it is rustyflow's: {fix}") from None
    if not mine:
        raise TrainingError(f"{what} {path} exists and was not written by rustyflow: it is "
                            f"not overwritten; move it away, or {fix}")


def check_replace(path: str, what: str, run_id: str | None, resume: str | None,
                  overwrite: bool, warn: Callable[[str], None],
                  recipe: dict[str, Any] | None = None) -> bool:
    """`path` may be (re)written by the run `run_id` (None: a new run): it does not exist,
    or it is this run's, or (then True) `overwrite` says a different run's may go, or that
    run had this run's `recipe` (its whole configuration): running the same command again
    repeats it and replaces its result, while any other run's model (a trained one under a
    short try, say) is kept."""
    target = Path(path)
    if not target.is_file():
        return False
    meta = checkpoint_meta(target)
    if meta is None:
        raise TrainingError(f"{what} {path} exists and is not a rustyflow checkpoint: it is "
                            f"not overwritten; move it away, or set --model-path to another "
                            f"file")
    theirs = run_id_of(meta)
    same_file = resume is not None and _same(resume, path)
    if (run_id is not None and theirs == run_id) or same_file:
        return False
    if overwrite:
        warn(f"WARN: --overwrite: replacing the {what} {path} of another run")
        return True
    if recipe is not None and same_recipe(meta.get("config"), recipe):
        warn(f"INFO: replacing the {what} {path} of an earlier run of the same configuration")
        return True
    train = meta.get("train")
    step = train.get("step") if isinstance(train, dict) else None
    at = f" (trained {step} steps)" if isinstance(step, int) else ""
    how = (f"resume it with --resume {path}, " if resume is None else "")
    raise TrainingError(
        f"{what} {path} holds another run's model{at}, which this run would replace: "
        f"{how}set --model-path to a new file, or pass --overwrite to replace it")


def same_recipe(stored: Any, current: dict[str, Any]) -> bool:
    """Whether a checkpoint's stored configuration is `current`, key by key. A key the stored
    one lacks was added by a later rustyflow than the one that wrote it, so it counts as equal
    when `current` holds that key's default: the same command after an upgrade is still the
    same run."""
    if not isinstance(stored, dict) or set(stored) - set(current):
        return False
    for name, value in current.items():
        if name in stored:
            if _json(stored[name]) != _json(value):
                return False
        elif name not in KEYS or _json(KEYS[name].default) != _json(value):
            return False
    return True


def _json(value: Any) -> str:
    """A value in the comparable form a checkpoint stores it in (JSON)."""
    return json.dumps(value, sort_keys=True, default=str)


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_distinct(paths: dict[str, str | None]) -> None:
    """No output of a run may be another of its outputs (or its lock file)."""
    seen: dict[Path, str] = {}
    for what, path in paths.items():
        if not path:
            continue
        for name, p in ((what, path), (f"{what} lock", f"{path}.lock")):
            key = Path(p).resolve()
            if key in seen:
                raise TrainingError(f"the {name} and the {seen[key]} are both {path}: one "
                                    f"would overwrite the other; give each its own path")
            if name == what:
                seen[key] = what


def clean_stale_temporaries(path: str, say: Callable[[str], None]) -> None:
    """Remove the temporaries that a killed rustyflow process left while writing `path`.

    A temporary's name holds its writer's pid (see outputs.write_atomically); only those of
    processes no longer running are removed, so a live writer's file and anyone else's
    files stay."""
    target = Path(path)
    if not target.parent.is_dir():
        return
    pattern = re.compile(re.escape(f".{target.name}.rustyflow-") + r"(\d+)-.*\.tmp\Z")
    for entry in target.parent.iterdir():
        match = pattern.match(entry.name)
        if match and entry.is_file() and not _alive(int(match.group(1))):
            try:
                entry.unlink()
            except OSError:
                continue
            say(f"Removed {entry}, a partial write of {path} left by a stopped run")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process, or no pid at all: not ours to judge
    return True
