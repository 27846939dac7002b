"""CPU kernels: the shared formulation, with the big row-wise passes split across cores.

NumPy ufuncs release the GIL, so a thread pool over row blocks scales the memory-bound
passes (softmax cross-entropy over (B*T, V) logits above all) with the core count.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .xp import XpKernels

_MIN_ROWS_PER_THREAD = 64


class CpuKernels(XpKernels):
    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.threads = max(1, os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None

    def set_threads(self, threads: int) -> None:
        self.threads = max(1, threads)
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _blocks(self, n: int) -> list[slice]:
        k = max(1, min(self.threads, n // _MIN_ROWS_PER_THREAD))
        bounds = np.linspace(0, n, k + 1).astype(int)
        return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _map(self, fn: Any, blocks: list[slice]) -> list[Any]:
        if len(blocks) == 1:
            return [fn(blocks[0])]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="rustyflow")
        return list(self._pool.map(fn, blocks))

    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any | None]:
        n = logits.shape[0]
        e = logits if inplace else np.empty_like(logits)
        losses = np.empty(n, dtype=logits.dtype)

        def block(rows: slice) -> None:
            x, out = logits[rows], e[rows]
            idx = np.arange(out.shape[0])
            t = targets[rows]
            np.subtract(x, x.max(axis=1, keepdims=True), out=out)
            picked = out[idx, t]
            np.exp(out, out=out)
            s = out.sum(axis=1)
            losses[rows] = np.log(s) - picked
            if need_grad:
                out *= (1.0 / (s * n))[:, None]
                out[idx, t] -= 1.0 / n

        self._map(block, self._blocks(n))
        return losses.mean(dtype=logits.dtype), (e if need_grad else None)

    def cross_entropy_backward(self, state: Any, g: Any) -> Any:
        if float(g) == 1.0:  # the usual seed gradient: skip a full pass
            return state
        state *= g
        return state
