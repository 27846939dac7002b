"""Pause points for the fault tests: a signal must land at a dangerous moment (inside the
final checkpoint write, inside evaluation, between a checkpoint's fsync and its rename), and
a sleep cannot aim that well.

The run calls `pause(point)` at each such moment: `checkpoint-rename` (a checkpoint or trace
is written and fsynced, not yet renamed into place), `evaluation` (a validation or test pass
begins) and `log-append` (the run's log block is about to be appended). It does nothing unless
the caller injected a `PausePoints` for the block it runs the command in (`with pausing(...)`:
the fault tests' harness, tests/paused_cli.py; a real run never does), so the moments are
named in the code that reaches them while the test's machinery lives in the test's object.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Iterator
from pathlib import Path


class PausePoints:
    """Hold the process the `nth` time (from 1) it reaches `point`: write its pid to the file
    `marker`, then wait until that file is removed. The test waits for the file, sends its
    signal, then removes the file."""

    def __init__(self, point: str, nth: int, marker: Path) -> None:
        self.point, self.nth, self.marker = point, nth, marker
        self.reached = 0  # times `point` was reached so far

    @classmethod
    def parse(cls, spec: str, marker: Path) -> PausePoints:
        """From `point` or `point:n` (the n-th time; default the first)."""
        point, _, nth = spec.partition(":")
        return cls(point, int(nth or 1), marker)

    def pause(self, point: str) -> None:
        if point != self.point:
            return
        self.reached += 1
        if self.reached != self.nth:
            return
        part = self.marker.with_name(f".{self.marker.name}.part")
        part.write_text(f"{os.getpid()}\n")
        os.replace(part, self.marker)  # whole when seen: a test snapshots the folder at once
        while self.marker.exists():
            time.sleep(0.005)  # a signal's handler runs here, between two sleeps


# the pause points injected for the block running now, in its context (None: a real run)
_injected: contextvars.ContextVar[PausePoints | None] = contextvars.ContextVar(
    "pause_points", default=None)


@contextlib.contextmanager
def pausing(points: PausePoints) -> Iterator[PausePoints]:
    """Inside the block (and its context), `pause` holds the process at `points`."""
    token = _injected.set(points)
    try:
        yield points
    finally:
        _injected.reset(token)


def pause(point: str) -> None:
    """Wait here if the block running this was given pause points (see the module docstring);
    otherwise, in every real run, one context-variable read."""
    points = _injected.get()
    if points is not None:
        points.pause(point)
