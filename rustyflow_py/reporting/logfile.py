"""Append-only writes to ``training_log.txt``.

Two runs may finish at the same moment (a CPU and a GPU job side by side), and a run that is
being interrupted must still leave a whole block behind. So each block goes to the file in one
write made while holding an exclusive ``flock`` on the descriptor, which keeps concurrent
writers from interleaving, and is fsynced before the lock is released so a crash right after
the run cannot lose it. The file is never rewritten; a write that fails part-way (a full disk,
a signal) is cut back to where the log ended, so no partial block is left behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os


def append_block(path: str | os.PathLike[str], text: str) -> None:
    """Append ``text`` as one block to the log at ``path``, creating the file on first use.

    The block is written on a line of its own, preceded by a blank line when the file already
    has content: a previous block (or a hand edit) that lost its final newline then cannot glue
    onto this block's first line, which is what the parser looks for.
    """
    body = text if text.endswith("\n") else text + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        locked = _lock(fd)
        try:
            # The size is read under the lock, so it already includes any block just appended.
            end = os.fstat(fd).st_size
            data = (("\n" if end > 0 else "") + body).encode("utf-8")
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except BaseException:
                with contextlib.suppress(OSError):  # the first error is the one to report
                    os.ftruncate(fd, end)  # no torn block: the log ends where it ended
                raise
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _lock(fd: int) -> bool:
    """Take the exclusive lock; False where the file system has none (some network mounts),
    where the block is still written by one O_APPEND write, which does not interleave with
    another on a local file system."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise
    return True
