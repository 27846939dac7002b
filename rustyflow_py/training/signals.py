"""Stop requests: Ctrl-C, and the signals schedulers send (SIGTERM, and SIGUSR1 before a
time limit), all handled alike.

Inside a training step a stop only sets a flag: the loop finishes the step, so the
checkpoint never pairs a half-applied update with the old position, then writes it and an
"interrupted" log block. A second Ctrl-C stops at once. Outside the steps (evaluation) a stop
takes effect at once, as Ctrl-C always did.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class Stopped(KeyboardInterrupt):
    """A stop request that ended the run; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopSignals:
    """The run's stop state: `requested` is the signal asked for (None when none was)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.requested: int | None = None
        self.deferred = False  # True inside a step or while writing outputs

    def check(self) -> None:
        """Raise the pending stop, if any (called between steps)."""
        if self.requested is not None:
            raise Stopped(self.requested)

    @contextmanager
    def deferring(self) -> Iterator[None]:
        """While inside, a stop waits for the block to end."""
        previous, self.deferred = self.deferred, True
        try:
            yield
        finally:
            self.deferred = previous

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise Stopped(signum)  # a second Ctrl-C: now
        if self.requested is not None:
            return
        self.requested = signum
        if not self.deferred:
            raise Stopped(signum)
        again = " (press Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""
        self.say(f"\n{name}: stopping after this step, then saving a checkpoint and the log "
                 f"block{again}")

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
