"""A heartbeat between the ranks, so that a silent rank ends the job instead of hanging it.

MPI aborts the whole job when a process dies under `mpiexec`, but a process that stops
without dying (SIGSTOP, a hung driver, a node that drops off the network, a dead task under
an srun that keeps the others going) leaves every other rank blocked for ever in its next
collective. So each rank runs a thread that sends a one-byte message to every other rank
every `timeout / 10` seconds and reads theirs; a rank not heard from for `timeout - interval`
seconds is named and the job aborted, so the job ends within COMM_TIMEOUT of the rank's
last beat (the check runs once an interval). The thread keeps beating while its
own main thread computes or waits in a collective (MPI and NumPy release the GIL), so only a
process that is stopped, or hung outside Python for that long, falls silent.

The messages travel on a duplicate of the world communicator of their own, so they never
match the training's. Every rank hears from every other: N x (N - 1) messages per beat,
negligible next to a step's gradients at the sizes one job of this trainer runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

_TAG = 7


class Heartbeat:
    """Beats to and listens for every rank of `comm` (an MPI communicator of its own) in a
    daemon thread; calls `on_silent(rank, seconds)` once, from that thread, for the first rank
    found silent (within `timeout` seconds of its last beat)."""

    def __init__(self, comm: Any, timeout: float,
                 on_silent: Callable[[int, float], None]) -> None:
        from mpi4py import MPI

        self.mpi, self.comm, self.timeout, self.on_silent = MPI, comm, timeout, on_silent
        self.rank = comm.Get_rank()
        self.peers = [r for r in range(comm.Get_size()) if r != self.rank]
        self.interval = min(max(timeout / 10, 0.05), 10.0)
        self.token, self.inbox = bytearray(1), bytearray(1)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rustyflow-heartbeat",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop beating (every rank stops at the end of a run, after its last barrier)."""
        self.stopping.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()

    def _run(self) -> None:
        last = dict.fromkeys(self.peers, time.monotonic())
        sends: list[Any] = []
        status = self.mpi.Status()
        while not self.stopping.is_set():
            sends = [r for r in sends if not r.Test()]
            sends += [self.comm.Isend([self.token, self.mpi.BYTE], p, _TAG) for p in self.peers]
            while self.comm.Iprobe(self.mpi.ANY_SOURCE, _TAG, status):
                source = status.Get_source()
                self.comm.Recv([self.inbox, self.mpi.BYTE], source, _TAG)
                last[source] = time.monotonic()
            now = time.monotonic()
            silent = max(self.peers, key=lambda p: now - last[p], default=None)
            if silent is not None and now - last[silent] > self.timeout - self.interval:
                self.on_silent(silent, now - last[silent])
                return
            self.stopping.wait(self.interval)
