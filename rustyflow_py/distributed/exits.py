"""The order in which a job's ranks exit, watched from `--gpus`'s launcher.

When one rank dies, MPI's launcher stops the others, often with the same SIGKILL, and its
report does not say which died first: MPICH's Hydra names one process of those it saw end,
sometimes one it killed itself. So the launcher watches the ranks' process ids (the pid
files they leave in $RUSTYFLOW_ERROR_DIR) through Linux's pidfds and records their exits in
order. The ranks are not our children, so this says when each exited, not how; how comes
from MPI's report. Where pidfds are missing (not Linux, or a kernel before 5.3) the order
stays empty and the launcher falls back on that report alone.
"""

from __future__ import annotations

import os
import select
import threading
from pathlib import Path

_POLL_MS = 50  # how soon a new pid file is seen; exits wake the poll at once


class ExitOrder:
    """A daemon thread that records the ranks of `folder`'s pid files as they exit.
    `order` lists them in order of exit; ranks whose exits one wake-up of the poll saw
    together share a place (a tuple), since which of them came first is not known."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.order: list[tuple[int, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rank-exits", daemon=True)
        if hasattr(os, "pidfd_open"):
            self._thread.start()

    def stop(self) -> list[tuple[int, ...]]:
        """Stop watching (the job has ended); the order seen."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.order

    def _watch(self) -> None:
        poll = select.poll()
        ranks: dict[int, int] = {}  # pidfd -> rank
        seen: set[int] = set()
        try:
            while not self._stop.is_set():
                ready = []  # the ranks seen to have exited at this look
                for rank, pid in _pid_files(self.folder, seen):
                    seen.add(rank)
                    try:
                        fd = os.pidfd_open(pid)
                    except OSError:  # gone already: exited by this look
                        ready.append(rank)
                        continue
                    ranks[fd] = rank
                    poll.register(fd, select.POLLIN)
                for fd, _ in poll.poll(_POLL_MS):
                    poll.unregister(fd)
                    os.close(fd)
                    ready.append(ranks.pop(fd))
                if ready:
                    self.order.append(tuple(sorted(ready)))
        finally:
            for fd in ranks:
                os.close(fd)


def _pid_files(folder: Path, seen: set[int]) -> list[tuple[int, int]]:
    """(rank, pid) of the pid files in `folder` not yet `seen` (each is written whole, by
    rename)."""
    found = []
    for path in folder.glob("rank-*.pid"):
        rank = int(path.stem.split("-")[1])
        if rank not in seen:
            found.append((rank, int(path.read_text())))
    return found
