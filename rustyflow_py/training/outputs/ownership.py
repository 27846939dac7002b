"""Whose file is it? A run writes only files that are its own, or rustyflow's and meant to be
replaced.

Every file rustyflow writes carries its mark where a reader meets it first: a checkpoint's
`meta` entry (format version, writer, run id), a log's first line (a `=== RustyFlow run`
block header), a trace's first bytes (its `otherData.producer`), a lock file's first line. A
mark found anywhere else does not count: a README that quotes a log block is not a log. Before
a run starts, each output path it will write is checked: one that exists without the mark is
someone else's file, and the run stops naming it; a checkpoint of a *different* run (another
run id) is replaced only with `--overwrite` or when that run had the same configuration, and
only when this run writes its own file there (see `check_replace`): nothing is removed at the
start. The paths must also be distinct: a trace written over the log would destroy the log.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import TrainingError
from ...reporting.record_schema import BLOCK_START
from ...reporting.trace import PRODUCER
from ..config.config import KEYS
from . import npz
from .checkpoint import WRITER
from .lock import lock_path

TRACE_HEAD = f'{{"otherData":{{"producer":{json.dumps(PRODUCER)}'.encode()  # its first bytes


def new_run_id() -> str:
    """A fresh run id: stored in every checkpoint the run writes, kept by --resume."""
    return uuid.uuid4().hex


def checkpoint_meta(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A rustyflow checkpoint's `meta` (read alone, its size checked before it is loaded), or
    None when the file is not one (another program's .npz, text, a damaged archive, a `meta`
    larger than the file can hold)."""
    try:
        members = npz.read(path, ["meta"])
        if "meta" not in members:
            return None
        meta = json.loads(str(members["meta"]))
    except (OSError, ValueError, npz.NpzError):
        return None
    ours = isinstance(meta, dict) and (meta.get("writer") == WRITER or "format_version" in meta)
    return meta if ours else None


def run_id_of(meta: dict[str, Any] | None) -> str | None:
    """The run id a checkpoint's meta records (None: written before run ids existed)."""
    train = (meta or {}).get("train")
    run_id = train.get("run_id") if isinstance(train, dict) else None
    return run_id if isinstance(run_id, str) else None


def _head(path: Path, size: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(size)


def is_log(path: Path) -> bool:
    """An empty file, or one whose first line is a rustyflow block header (every block starts
    with one, and the first block starts the file)."""
    mark = BLOCK_START.encode()
    head = _head(path, len(mark))
    return head == b"" or head == mark


def is_trace(path: Path) -> bool:
    """A file that starts as a trace `rustyflow train --trace` wrote."""
    return _head(path, len(TRACE_HEAD)) == TRACE_HEAD


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
                  overwrite: bool, recipe: dict[str, Any] | None = None,
                  heir: bool = False, fallback: str | None = None) -> str | None:
    """Whether the run `run_id` (None: a new run) may write `path`, and what that replaces.

    None: nothing of another run's is there (no file, or this run's own). A line to say when
    this run's first write there replaces the other run's file (nothing is removed before):
    `overwrite` says a different run's may go; that run had this run's `recipe` (its whole
    configuration), so running the same command again repeats it; or `heir`: the file is the
    best checkpoint beside the checkpoint this run resumes, whose run replaced that file's
    run at this path. Any other run's model (a trained one under a short try, say) is kept:
    TrainingError saying how to go on, and, when this run fell back from a GPU (`fallback`,
    the reason), that the fallback is what put it on the CPU run's path."""
    target = Path(path)
    if not target.is_file():
        return None
    meta = checkpoint_meta(target)
    if meta is None:
        raise TrainingError(f"{what} {path} exists and is not a rustyflow checkpoint: it is "
                            f"not overwritten; move it away, or set --model-path to another "
                            f"file")
    theirs = run_id_of(meta)
    resumed = resume is not None and same_file(resume, path)
    if (run_id is not None and theirs == run_id) or resumed:
        return None
    train = meta.get("train")
    step = train.get("step") if isinstance(train, dict) else None
    at = f" (trained {step} steps)" if isinstance(step, int) else ""
    if overwrite:
        return f"WARN: --overwrite: replaced the {what} {path} of another run{at}"
    if heir:
        return (f"INFO: replaced the {what} {path}{at}, which the run this one resumes had "
                f"not replaced yet")
    if recipe is not None and same_recipe(ran_as(meta.get("config"), meta.get("device")),
                                          recipe):
        return (f"INFO: replaced the {what} {path} of an earlier run of the same "
                f"configuration{at}")
    how = (f"resume it with --resume {path}, " if resume is None else "")
    if fallback:
        raise TrainingError(
            f"{what} {path} holds another run's model{at}, which this run would replace: the "
            f"GPU is not usable ({fallback}), so this run fell back to the CPU and writes the "
            f"CPU run's checkpoint; {how}set --model-path to a new file, pass --overwrite to "
            f"replace it, or --strict-device to stop instead of falling back")
    raise TrainingError(
        f"{what} {path} holds another run's model{at}, which this run would replace: "
        f"{how}set --model-path to a new file, or pass --overwrite to replace it")


def ran_as(config: Any, device: Any) -> Any:
    """A run's configuration as it ran: DEVICE is the kind of device it trained on (cpu or
    gpu), not the one it asked for (auto, or a GPU it fell back from), so that runs of one
    computation are one recipe however they named the device (train_gpu.sh falling back on a
    machine without a GPU repeats train_cpu.sh's run)."""
    if isinstance(config, dict) and isinstance(device, str) and device:
        return {**config, "DEVICE": device.partition(":")[0]}
    return config


def same_recipe(stored: Any, current: dict[str, Any]) -> bool:
    """Whether a checkpoint's stored configuration is `current`, key by key. A key the stored
    one lacks was added by a later rustyflow than the one that wrote it, so it counts as equal
    when `current` holds that key's default: the same command after an upgrade is still the
    same run."""
    if not isinstance(stored, dict) or set(stored) - set(current):
        return False
    for name, value in current.items():
        if name in stored:
            if _json(stored[name]) != _json(value) and not _inert(name, stored, current):
                return False
        elif name not in KEYS or _json(KEYS[name].default) != _json(value):
            return False
    return True


def _inert(name: str, stored: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether key `name` changes nothing in either run (Key.needs: FP8_SCALING in two runs
    without fp8, whose checkpoints stored the default of their day)."""
    return name in KEYS and not KEYS[name].applies(stored) and not KEYS[name].applies(current)


def _json(value: Any) -> str:
    """A value in the comparable form a checkpoint stores it in (JSON)."""
    return json.dumps(value, sort_keys=True, default=str)


def same_file(a: str, b: str) -> bool:
    """Whether the paths `a` and `b` name one file (or would, once written)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_distinct(paths: dict[str, str | None], locked: tuple[str, ...]) -> None:
    """No file a run writes may be another one it writes: its outputs `paths` and the lock
    files of those named in `locked`. A log at a lock's path would wait forever for the lock
    the run itself holds, and the lock's removal at the end would take the log with it."""
    files = [(what, path) for what, path in paths.items() if path]
    files += [(f"{what}'s lock file", str(lock_path(path))) for what, path in files
              if what in locked]
    seen: dict[Path, str] = {}
    for what, path in files:
        key = Path(path).resolve()
        if key in seen:
            raise TrainingError(f"the {what} and the {seen[key]} are both {path}: one "
                                f"would overwrite the other; give each its own path")
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
