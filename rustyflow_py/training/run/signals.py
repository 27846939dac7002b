"""Stop requests: Ctrl-C, and the signals schedulers send (SIGTERM, and SIGUSR1 before a
time limit), all handled alike.

Inside a training step a stop only sets a flag: the loop finishes the step, so the
checkpoint never pairs a half-applied update with the old position, then writes it and an
"interrupted" log block. A second Ctrl-C stops at once and writes nothing more: it says so,
and what is on disk then (a write it cuts short leaves no partial file). Outside the steps
(evaluation) a stop takes effect at once, as Ctrl-C always did. A second SIGTERM or SIGUSR1
changes nothing: a scheduler that wants the process gone sooner sends SIGKILL.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
STEP = "stopping after this step, then saving a checkpoint and the log block"
WRITES = "stopping once the checkpoint being written is whole, then writing the log block"
FINAL = "the run has ended: stopping once its checkpoint and log block are written"


class Stopped(KeyboardInterrupt):
    """A stop request that ended the run; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int = signal.SIGINT, abandoned: bool = False) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.abandoned = abandoned  # a second Ctrl-C: nothing more is written
        self.checkpoint: str | None = None  # where the run saved before stopping, if it did

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopSignals:
    """The run's stop state: `requested` is the signal asked for (None when none was)."""

    def __init__(self, say: Callable[[str], None],
                 on_disk: Callable[[], str] = lambda: "") -> None:
        self.say = say
        self.on_disk = on_disk  # what a stop now would leave on disk, in words
        self.requested: int | None = None
        self.deferred = False  # True inside a step or while writing outputs
        self.plan = STEP  # what a deferred stop does, in words

    def check(self) -> None:
        """Raise the pending stop, if any (called between steps)."""
        if self.requested is not None:
            raise Stopped(self.requested)

    @contextmanager
    def deferring(self, plan: str = STEP) -> Iterator[None]:
        """While inside, a stop waits for the block to end; `plan` says what happens then."""
        previous = self.deferred, self.plan
        self.deferred, self.plan = True, plan
        try:
            yield
        finally:
            self.deferred, self.plan = previous

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            self.say(f"\n{name} again: stopping now, without saving a checkpoint or the log "
                     f"block; {self.on_disk()}")
            raise Stopped(signum, abandoned=True)
        if self.requested is not None:
            return
        self.requested = signum
        if not self.deferred:
            raise Stopped(signum)
        again = (" (Ctrl-C again stops at once, without saving)" if signum == signal.SIGINT
                 else "")
        self.say(f"\n{name}: {self.plan}{again}")

    @contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """Route SIGINT/SIGTERM/SIGUSR1 here while inside (main thread only: Python delivers
        signals there; elsewhere nothing is installed)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in HANDLED}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
