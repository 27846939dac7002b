"""Where a run's outputs go, checked before any work and saved without losing them.

A run that trains for an hour and then cannot write its checkpoint or log block has lost the
hour. So the checkpoint folder and the log file are probed up front (fail in milliseconds with
the path and the reason), and if a write still fails at the end, the output goes to a fallback
file that the message names.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ...errors import TrainingError
from ..run import hooks


def _reason(exc: OSError) -> str:
    return exc.strerror or (errno.errorcode.get(exc.errno or 0) or type(exc).__name__)


def _probe_folder(folder: Path) -> None:
    """Create `folder` if needed, then write, flush and remove a small file in it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".rustyflow-probe-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"probe\n")
            f.flush()
            os.fsync(f.fileno())
    finally:
        Path(probe).unlink(missing_ok=True)


def check_checkpoint_target(path: str) -> None:
    """The checkpoint `path` can be written: its folder takes a new file, and the path is not
    a folder or a device. Raises TrainingError naming the path and the reason."""
    target = Path(path)
    if target.is_dir():
        raise TrainingError(f"checkpoint {path} is a folder: set MODEL_PATH to a file path "
                            f"ending in .npz")
    if target.exists() and not target.is_file():
        raise TrainingError(f"checkpoint {path} exists and is not a regular file: set "
                            f"MODEL_PATH to a file path ending in .npz")
    for folder in (target.parent, *target.parent.parents):
        if folder.exists() and not folder.is_dir():
            raise TrainingError(f"cannot write the checkpoint {path}: {folder} is not a "
                                f"folder; set MODEL_PATH to a writable place")
    try:
        _probe_folder(target.parent)
    except OSError as exc:
        raise TrainingError(f"cannot write the checkpoint {path}: {target.parent} is not "
                            f"writable ({_reason(exc)}); set MODEL_PATH to a writable "
                            f"place") from None


def check_file_target(path: str, what: str, fix: str) -> None:
    """`path` can be written as a whole file (not a folder; its folder takes a new file).
    Raises TrainingError naming the `what`, the path, the reason and the `fix`."""
    target = Path(path)
    if target.is_dir():
        raise TrainingError(f"{what} {path} is a folder: {fix}")
    try:
        _probe_folder(target.parent)
    except OSError as exc:
        raise TrainingError(f"cannot write the {what} {path}: {target.parent} is not "
                            f"writable ({_reason(exc)}); {fix}") from None


def write_atomically(path: str | os.PathLike[str], fill: Callable[[BinaryIO], object]) -> Path:
    """fill(file) into a temporary file in `path`'s folder, fsynced, then renamed over `path`:
    a reader never sees half a file, and a failed write leaves the old one in place. The
    temporary's name holds this process's pid, so a later run can tell an orphan (its writer
    is dead) from a write in progress (ownership.clean_stale_temporaries). The file gets the
    mode a plain open() would give it (0644 under the usual umask), not the temporary file's
    private 0600."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.rustyflow-{os.getpid()}-",
                               suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        hooks.pause("checkpoint-rename")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    """The process's umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_log_file(path: str) -> None:
    """The log `path` can be appended to (a regular file, or a new one in a writable folder).
    Raises TrainingError naming the path and the reason."""
    target = Path(path)
    if target.is_dir():
        raise TrainingError(f"log file {path} is a folder: set LOG_FILE to a file path")
    if target.exists() and not stat.S_ISREG(target.stat().st_mode):
        raise TrainingError(f"log file {path} is not a regular file (a device or pipe cannot "
                            f"hold the append-only log): set LOG_FILE to a file path")
    try:
        _probe_folder(target.parent)
        if target.exists():  # a new log is created by the first block, not by this check
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC))
    except OSError as exc:
        raise TrainingError(f"cannot append to the log file {path} ({_reason(exc)}); set "
                            f"LOG_FILE to a writable path") from None


def fallbacks(path: str, name: str | None = None) -> list[Path]:
    """Other places for an output that could not be written: the current folder, then the
    temporary folder, under `name` (default: the same file name), or under a numbered name
    when that exists: a fallback never writes over anything."""
    name = name or Path(path).name
    places = [_free(Path.cwd() / name), _free(Path(tempfile.gettempdir()) / name)]
    return [p for p in places if p.resolve() != Path(path).resolve()]


def _free(place: Path) -> Path:
    """`place`, or the first of place-1, place-2, ... (before the suffix) that does not
    exist."""
    n = 0
    while place.exists() or place.is_symlink():
        n += 1
        place = place.with_name(f"{place.stem.rsplit('-rescued', 1)[0]}-rescued{n}"
                                f"{place.suffix}")
    return place


@dataclasses.dataclass(frozen=True)
class Written:
    """Where an output went: `place` (None: nowhere), and when that place is a fallback,
    `rescued`: the phrase `went to FALLBACK instead of PATH (REASON)` (its subject is the
    caller's). A run whose output went to a fallback or nowhere did not complete."""

    place: str | None
    rescued: str | None = None


def write_with_fallback(path: str, write: Callable[[str], object], what: str,
                        warn: Callable[[str], None], name: str | None = None) -> Written:
    """write(path); if that fails, write(fallback) for each fallback in turn. Returns where it
    went, after one warning line that names the failure and the place."""
    try:
        write(path)
        return Written(path)
    except OSError as exc:
        reason = _reason(exc)
    first = f"could not write the {what} to {path} ({reason})"
    places = fallbacks(path, name)
    for place in places:
        try:
            write(str(place))
        except OSError:
            continue
        warn(f"WARN: {first}; wrote it to {place} instead: the run will end failed")
        return Written(str(place), f"went to {place} instead of {path} ({reason})")
    tried = f", nor to {' or '.join(map(str, places))}" if places else ""
    warn(f"WARN: {first}{tried}: it is lost")
    return Written(None)

