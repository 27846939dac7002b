"""A run's lock on its checkpoint: two runs writing one checkpoint would overwrite each
other's work without a word.

The lock is an advisory `flock` on a sidecar file (`<checkpoint>.lock`), not on the
checkpoint itself: the checkpoint is replaced by a rename at every save, which would leave a
lock on the old inode. The sidecar holds who took it ("pid N since T"), so the second run can
say who has it. The kernel drops an flock when its process dies, however it dies, so a lock
file whose flock is free was left by a dead run: it is taken over, with a line saying so.
Where the file system has no locks (some network mounts), the run goes on with a warning.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from ...errors import TrainingError

MARK = "rustyflow run lock"
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def lock_path(path: str) -> Path:
    """The sidecar lock file of the output `path`."""
    return Path(f"{path}.lock")


def _holder(text: str) -> str:
    """'pid N since T (host H)' from a lock file's text, or a plain phrase when unreadable."""
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if not fields.get("pid"):
        return "another process"
    since = fields.get("since", "an unknown time")
    return f"pid {fields['pid']} since {since} (host {fields.get('host', '?')})"


class RunLock:
    """Exclusive locks on a run's outputs, held until `release()` (or the process ends)."""

    def __init__(self) -> None:
        self._held: list[tuple[Path, int]] = []

    def acquire(self, path: str, what: str, warn: Callable[[str], None]) -> None:
        """Lock `path` (via its sidecar) or raise TrainingError naming the holder."""
        target = lock_path(path)
        collected = False
        while True:
            fd = self._open(target)
            state, previous = self._try(fd, target, what, warn)
            if state == "unsupported":
                return  # warned
            if state == "locked":
                self._claim(fd, target, previous, what, warn)
                return
            os.close(fd)
            if state == "moved":
                continue  # released and removed between our open and flock: lock the new one
            if not collected and f"pid={os.getpid()}\n" in previous:
                collected = True
                # This process holds it through a run object not yet collected (a run that
                # failed to start): its lock goes with it.
                gc.collect()
                continue
            raise TrainingError(
                f"{what} {path} is in use by {_holder(previous)}: another run is writing it. "
                f"Wait for that run to end, or set --model-path to another file "
                f"(the lock is {target})")

    def _open(self, target: Path) -> int:
        if target.exists() and not target.is_file():
            raise TrainingError(f"{target} exists and is not a file, so the run cannot lock "
                                f"its checkpoint: move it away")
        if target.is_file() and target.stat().st_size and not _is_lock_file(target):
            raise TrainingError(f"{target} exists and was not written by rustyflow: it is "
                                f"not overwritten; move it away or set --model-path to "
                                f"another file")
        return os.open(target, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    @staticmethod
    def _try(fd: int, target: Path, what: str,
             warn: Callable[[str], None]) -> tuple[str, str]:
        """locked, busy (another holds it), moved (the file was replaced) or unsupported;
        and the file's text before this call."""
        previous = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "busy", os.pread(fd, 4096, 0).decode("utf-8", "replace")
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
            os.close(fd)
            warn(f"WARN: the file system of {target} has no file locks ({exc.strerror}): "
                 f"the {what} is not protected against a second run writing it at once")
            return "unsupported", previous
        if os.fstat(fd).st_ino != _inode(target):
            return "moved", previous
        return "locked", previous

    def _claim(self, fd: int, target: Path, previous: str, what: str,
               warn: Callable[[str], None]) -> None:
        if "pid=" in previous:
            warn(f"WARN: took over the lock on the {what} left by {_holder(previous)}, "
                 f"which is no longer running")
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        text = f"{MARK}\npid={os.getpid()}\nsince={since}\nhost={socket.gethostname()}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
        self._held.append((target, fd))

    def release(self) -> None:
        """Remove the lock files (still locked, so no one else takes a half-removed one),
        then drop the locks."""
        while self._held:
            target, fd = self._held.pop()
            try:
                if os.fstat(fd).st_ino == _inode(target):
                    target.unlink()
            except OSError:
                pass  # gone already; the lock itself goes with the descriptor
            os.close(fd)

    def __del__(self) -> None:
        self.release()


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def _is_lock_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MARK)) == MARK.encode()
    except OSError:
        return False
