"""Peak GPU memory in use, the way torch.cuda.max_memory_allocated counts it.

CuPy's pools keep freed blocks cached, so their size (reserved memory) overstates what a step
needs. A CuPy memory hook sees every block handed out and given back; while it is active it
tracks the bytes in use, starting from what the default pool already holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class PeakMemory:
    def __init__(self) -> None:
        import cupy

        class _Hook(cupy.cuda.MemoryHook):
            name = "rustyflow_peak_memory"

            def __init__(hook) -> None:
                hook.live = 0

            def malloc_postprocess(hook, **kw: Any) -> None:
                hook.live += kw["mem_size"]
                self.peak = max(self.peak, hook.live)

            def free_postprocess(hook, **kw: Any) -> None:
                hook.live -= kw["mem_size"]

        self._pool = cupy.get_default_memory_pool()
        self._hook = _Hook()
        self.peak = 0

    @contextlib.contextmanager
    def tracking(self, extra_in_use: int = 0) -> Iterator[None]:
        """Track while inside; `extra_in_use` counts memory held outside the default pool."""
        self._hook.live = int(self._pool.used_bytes()) + extra_in_use
        self.peak = max(self.peak, self._hook.live)
        with self._hook:
            yield
