"""Pause points for the fault tests: a signal must land at a dangerous moment (inside the
final checkpoint write, inside evaluation, between a checkpoint's fsync and its rename), and
a sleep cannot aim that well.

With RUSTYFLOW_PAUSE_AT=<point>[:<n>] the process, on reaching `point` for the n-th time
(default the first), writes its pid to the file RUSTYFLOW_PAUSE_MARKER and waits until that
file is removed. The points: `checkpoint-rename` (a checkpoint or trace is written and
fsynced, not yet renamed into place), `evaluation` (a validation or test pass begins) and
`log-append` (the run's log block is about to be appended).
The test waits for the file, sends its signal, then removes the file. Unset (every real
run), a pause point costs one dictionary look-up.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

_reached: Counter[str] = Counter()


def pause(point: str) -> None:
    """Wait here if the environment asks for `point` (see the module docstring)."""
    wanted = os.environ.get("RUSTYFLOW_PAUSE_AT")
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != point:
        return
    _reached[point] += 1
    if _reached[point] != int(nth or 1):
        return
    marker = Path(os.environ["RUSTYFLOW_PAUSE_MARKER"])
    part = marker.with_name(f".{marker.name}.part")
    part.write_text(f"{os.getpid()}\n")
    os.replace(part, marker)  # whole when seen: a test snapshots the folder as soon as it is
    while marker.exists():
        time.sleep(0.005)  # a signal's handler runs here, between two sleeps
