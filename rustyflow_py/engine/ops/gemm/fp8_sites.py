"""Where a PRECISION=fp8 run's casts keep their amax, and how each cast is scaled from it.

Each cast inside the first captured graph takes a site: a float32 row of fp8.cuh's rf_site on
the device, keeping its tensor's amax for the replays after. Under delayed scaling
(FP8_SCALING=delayed, Transformer Engine's recipe) a replay's cast is scaled by the amax of
the last replay at its site and takes this one's on the way, so it needs no amax pass of its
own; each captured graph counts its replays on the device, its first kernel adding 1. Under
current scaling the site only records the amax each replay measures. The run record reads
the sites back after training (`tensors`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..fp8 import cuda as casts
from ..fp8.formats import Fp8Format, scale_of

MAX_SITES = 8192  # site rows: a step's casts (4 a Linear) many times over
MAX_CAPTURES = 64  # captured graphs with their own replay counts (delayed scaling)


class Fp8Sites:
    """The sites of one kernel set's FP8 casts, on the device of its cuBLASLt handle (`lt`:
    its stream tells whether a capture is under way), and which capture each belongs to."""

    def __init__(self, lt: Callable[[], Any], delayed: bool) -> None:
        self._lt = lt
        self.delayed = delayed  # FP8_SCALING=delayed: see scaling
        self.rows: Any = None  # (MAX_SITES, 4) float32 rf_site rows
        self.next_row = 0  # the row the next cast takes
        self._captured = False  # whether the first capture has begun
        self._in_capture = False  # whether the last cast was inside one
        self.replays: Any = None  # delayed: uint32 (MAX_CAPTURES,), each capture's replays
        self._capture = -1  # the capture under way's replay count, -1: none (current)
        self._counts = 0  # replay counts taken
        # the captured casts' tensors by site row: (what, format, shape, capture or None)
        self._what: dict[int, tuple[str, Fp8Format, tuple[int, ...], int | None]] = {}

    def tensors(self) -> list[dict[str, Any]] | None:
        """Each tensor the captured steps cast to FP8, in the order of their casts: what it
        is, its format and shape, the amax of its last replay and the scale that amax gives
        (formats.scale_of; under delayed scaling the one its next replay takes). None before
        a capture. Reads the device: a query after training, never inside a step."""
        if not self._what:
            return None

        def host(a: Any) -> np.ndarray:
            return np.asarray(a.get() if hasattr(a, "get") else a)

        rows = host(self.rows[: max(self._what) + 1])
        replays = host(self.replays) if self.replays is not None else None
        out = []
        for i, (what, fmt, shape, capture) in sorted(self._what.items()):
            # delayed: replay r filled slot r % 3 (rf_site); current: slot 0, each replay
            slot = 0 if capture is None or replays is None else int(replays[capture]) % 3
            amax = rows[i, slot]
            out.append({"tensor": what, "format": fmt.name, "shape": list(shape),
                        "amax": float(amax), "scale": float(scale_of(amax, fmt))})
        return out

    def scaling(self, what: str, fmt: Fp8Format, shape: tuple[int, ...]) -> casts.Scaling:
        """The next cast's scaling, for the tensor `what` (fmt, shape). Inside the first
        captured graph each cast takes a site row, in call order from row 0, that keeps the
        amax of its replays (`tensors`): current scaling measures it there, delayed scaling
        (FP8_SCALING=delayed) scales the next replay by it, each capture counting its
        replays on the device (`_begin_capture`). Before that capture, each eager cast of a
        delayed run measures its amax into the row of the same number, so the first replay
        is scaled by the warm-up step's amax of the same cast (the same code, in the same
        order). Other eager casts are current. A later capture's casts take the rows after
        the first's, seeded only where eager casts before the first capture filled them (else
        a delayed replay's first scale is 1); past MAX_CAPTURES, a capture scales currently."""
        capturing = self._lt().stream.is_capturing()
        if capturing and not self._in_capture:
            self._begin_capture()
        self._in_capture = capturing
        if self.rows is None and not capturing:  # made in a capture, zeroed every replay
            xp = self._lt().xp
            self.rows = xp.zeros((MAX_SITES, 4), np.float32)
            self.replays = xp.zeros(MAX_CAPTURES, np.uint32)
        if ((self._captured and not capturing) or (not capturing and not self.delayed)
                or self.rows is None or self.next_row >= MAX_SITES):
            return casts.CURRENT
        i, row = self.next_row, self.rows[self.next_row]
        self.next_row += 1
        if not capturing:
            return casts.Scaling(amax=row[0:1])  # the slot the first replay reads
        delayed = self.delayed and self._capture >= 0
        self._what[i] = (what, fmt, tuple(shape), self._capture if delayed else None)
        if not delayed:
            return casts.Scaling(amax=row[0:1])
        return casts.Scaling(site=row, replay=self.replays[self._capture:self._capture + 1])

    def _begin_capture(self) -> None:
        """A capture's first cast (the first cast inside a capture after one outside): the
        first capture's casts take the site rows from 0 again; with delayed scaling, the
        capture takes a replay count of its own and adds 1 to it as its first kernel (inside
        the graph: once a replay, before any cast reads it)."""
        if not self._captured:
            self._captured, self.next_row = True, 0
        self._capture = -1  # current scaling, unless it gets a replay count of its own
        if self.delayed and self.replays is not None and self._counts < len(self.replays):
            self._capture, self._counts = self._counts, self._counts + 1
            self.replays[self._capture:self._capture + 1] += 1
