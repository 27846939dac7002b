"""The ground every CPU kernel stands on: one thread pool fed cache-sized blocks, and the
buffers reused from call to call.

The elementwise and row-wise passes (softmax cross-entropy over the (B*T, V) logits, GELU,
attention softmax, LayerNorm, AdamW) release the GIL, so a pool of threads scales them. Work
is cut into cache-sized blocks that the threads take from one shared queue: a kernel's
several passes over a block hit the cache rather than memory, and a core slowed down by
another process simply takes fewer blocks instead of holding the others up. (Whether a
block runs NumPy's calls or a numba kernel, CPU_JIT, is the kernel set's: cpu_set.py.)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..devices import numpy_blas
from ..policy import RunPolicy
from .table import KernelSet

Blocks = Iterator[tuple[int, int]]

# Sizes in elements. Every NumPy call re-takes the GIL, so threads working on small blocks
# queue for it (small blocks made AdamW slower on 2 threads than on 1); blocks of 128K+
# elements keep the calls long and still sit in the L2/L3 caches.
BLOCK = 128 * 1024  # a cache block of the elementwise passes
MIN_PARALLEL = 256 * 1024  # the least work (elements) worth another thread

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc mallopt parameters


def _keep_freed_memory() -> None:
    """Serve every allocation from the heap and never hand freed memory back (glibc only).

    By default glibc maps each block over 32 MiB freshly and unmaps it on free, so every
    large activation is page-faulted and zeroed again at every step (at the small shape that
    was about a quarter of the step). Now freed blocks are reused;
    the price is that the process keeps its peak heap, which a training run reaches anyway.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: leave the allocator alone
        return
    mallopt(_M_MMAP_MAX, 0)
    mallopt(_M_TRIM_THRESHOLD, -1)


def _blas_threads_setter() -> Callable[[int], None] | None:
    """BLAS's set_num_threads (threadpoolctl's), after making it single-threaded; None if
    this NumPy's BLAS cannot be controlled."""
    blas = numpy_blas()
    if blas is None:
        return None
    setter: Callable[[int], None] = blas.set_num_threads
    setter(1)
    return setter


def _blocks(start: int, stop: int, size: int) -> Blocks:
    for i in range(start, stop, size):
        yield i, min(i + size, stop)


class CpuPool(KernelSet):
    """The CPU kernel set's state, which its op families share: threads, pools and buffers.

    Threads come from the run's policy, read when the set (or a view of it for another
    policy, `bound`) is made; the buffers are the device's, shared by its views."""

    kind = "cpu"

    def __init__(self, backend: Any) -> None:
        self._spare: dict[tuple[tuple[int, ...], Any], np.ndarray] = {}  # see _workspace
        self._ones: dict[tuple[int, Any], np.ndarray] = {}
        # worker threads by THREADS, made on first use and shared by the device's views (a
        # view for each run policy would otherwise start, and keep, a pool of its own)
        self._pools: dict[int, ThreadPoolExecutor] = {}
        # BLAS pinned to one thread once for the device (threadpoolctl reads every loaded
        # library to find it), not again for each view
        self._set_blas_threads = _blas_threads_setter()
        super().__init__(backend)
        _keep_freed_memory()

    def _read_policy(self, policy: RunPolicy) -> None:
        """THREADS cores; GEMMs are split by the pool only when BLAS can be pinned to one
        thread per call (otherwise BLAS threads itself and chunks would oversubscribe)."""
        super()._read_policy(policy)
        self.threads = policy.cpu_threads
        self.split_gemms = self.threads > 1 and self._set_blas_threads is not None
        # BLAS's own threads for the products the pool does not cut: THREADS may be any
        # number, BLAS takes at most the cores this process may use
        self._blas_cores = min(self.threads, len(os.sched_getaffinity(0)))

    @contextlib.contextmanager
    def blas_threaded(self) -> Iterator[None]:
        """Inside, BLAS runs on THREADS threads of its own (only where split_gemms pinned it
        to one): for the products the pool cannot cut cheaply, called from one thread while
        no other GEMM runs (GEMMs come from the caller's thread; the pool runs the chunks of
        larger ones, never inside this block; a CPU decode step, model/decode.py, holds one
        around all of its products)."""
        setter = self._set_blas_threads
        if setter is None:
            yield
            return
        setter(self._blas_cores)
        try:
            yield
        finally:
            setter(1)

    def _parallel(self, worker: Callable[[Blocks], Any], n: int, block: int,
                  work: float) -> list[Any]:
        """worker(blocks) on each thread, all drawing (start, stop) blocks of [0, n) from one
        shared iterator (a list iterator: atomic under the GIL). The caller's thread is one
        of them; `work` elements below MIN_PARALLEL per thread use fewer threads."""
        blocks = list(_blocks(0, n, max(1, block)))
        k = min(self.threads, len(blocks), max(1, int(work // MIN_PARALLEL)))
        shared = iter(blocks)
        if k == 1:
            return [worker(shared)]
        pool = self._pools.get(self.threads)
        if pool is None:
            pool = self._pools[self.threads] = ThreadPoolExecutor(
                self.threads - 1, thread_name_prefix="rustyflow")
        futures = [pool.submit(worker, shared) for _ in range(k - 1)]
        first = worker(shared)
        return [first, *(f.result() for f in futures)]

    def _workspace(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """The (N, V) buffer of the LM head, reused from step to step (its pages are faulted
        in once, whatever the allocator). One is kept per shape given back, so training and
        evaluation batches each keep theirs instead of fragmenting the heap in turn."""
        buf = self._spare.pop((shape, np.dtype(dtype)), None)
        return np.empty(shape, dtype) if buf is None else buf

    def _give_back(self, buf: np.ndarray) -> None:
        self._spare[(buf.shape, buf.dtype)] = buf

    def _ones_vector(self, n: int, dtype: Any) -> np.ndarray:
        """ones(n): row and column sums as BLAS GEMVs, which beat NumPy's sum() (a pairwise
        reduction that does not use BLAS)."""
        key = (n, np.dtype(dtype))
        if key not in self._ones:
            self._ones[key] = np.ones(n, dtype)
        return self._ones[key]
