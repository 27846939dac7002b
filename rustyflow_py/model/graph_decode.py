"""The decode step as a CUDA graph: captured once, replayed for every token.

A step of a small model is a few microseconds of GPU work behind ~15 kernel launches per
layer from Python; a graph replays all of them in one launch. The step (decode.py) reads
its token ids and position from device buffers and writes fixed logits, so one capture at
the full window (attention over all SEQ_LEN cached positions, those after the position
masked) serves every position. The warm-up runs it eagerly first, so kernels compile and
libraries allocate their workspaces outside the capture. If capture fails, the eager step
is used from then on, with a warning.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..engine.graph import CapturedStep, GraphCaptureError
from .decode import DecodeStep


class GraphDecode:
    """Runs a DecodeStep as a replayed CUDA graph, or eagerly once capture has failed."""

    def __init__(self, step: DecodeStep, warn: Callable[[str], None]) -> None:
        self.step, self.warn = step, warn
        self.full = step.cfg.seq_len
        self.graph: CapturedStep | None = None
        self.failed = False
        self.capture_s = 0.0  # the capture's time (generation's start-up line shows it)

    def __call__(self, n: int) -> None:
        """The step for the current tokens and position (n: the eager step's window)."""
        if self.graph is None and not self.failed:
            self._capture()
        if self.graph is None:
            self.step(n)
        else:
            self.graph.replay()

    def _capture(self) -> None:
        # Eager warm-up at the capture's shapes: it writes the same keys, values and logits
        # the replay below writes again for the same inputs.
        self.step(self.full)
        graph = CapturedStep(self.step.backend, lambda: self.step(self.full))
        start = time.perf_counter()
        try:
            graph.capture()
        except GraphCaptureError as exc:
            self.failed = True
            self.warn(f"WARN: the decode step could not be captured as a CUDA graph ({exc}); "
                      "decoding eagerly")
            return
        self.capture_s = time.perf_counter() - start
        self.graph = graph
