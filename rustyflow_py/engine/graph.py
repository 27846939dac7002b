"""Whole-step CUDA graphs: record one training step once, then replay it.

Everything a step reads or writes that outlives it (parameters, gradients, optimizer state,
the step counter, the token stream, the loss ring) is allocated before capture; the step's
temporaries come from a private memory pool that nothing else allocates from, so a replay
can never overwrite memory someone else was handed after the capture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class GraphCaptureError(RuntimeError):
    """The step could not be captured (an op synchronised, copied to the host, ...)."""


class CapturedStep:
    def __init__(self, backend: Any, body: Callable[[], None]) -> None:
        import cupy

        self.backend, self.body = backend, body
        self.pool = cupy.cuda.MemoryPool()
        self.graph: Any = None

    def capture(self) -> None:
        import cupy

        stream = self.backend.stream
        # The backend's stream is made current (CuPy launches its kernels on the current
        # stream; cuBLAS calls name the backend's): another backend made since may have left
        # its own current, and a kernel launched elsewhere would run once now and be missing
        # from every replay. By use(), not `with stream:`: on leaving a `with`, CuPy makes
        # current the stream below on its own stack, which is the legacy default stream when
        # the backend's was made current by use(), so everything launched afterwards (a
        # sampler, the next token's inputs) ran there, unordered with the replays on this
        # non-blocking stream.
        self.backend.make_current()
        with cupy.cuda.using_allocator(self.pool.malloc):
            stream.begin_capture()
            try:
                self.body()
            except Exception as exc:
                try:
                    stream.end_capture()
                except Exception:  # the capture is already invalidated; nothing to keep
                    pass
                raise GraphCaptureError(f"{type(exc).__name__}: {exc}") from exc
            self.graph = stream.end_capture()
        self.graph.upload(stream)

    def replay(self) -> None:
        self.graph.launch(self.backend.stream)

    def pool_bytes(self) -> int:
        return int(self.pool.total_bytes())
