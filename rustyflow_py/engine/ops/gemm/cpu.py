"""CPU GEMMs cut into single-threaded BLAS calls that run on RustyFlow's own pool.

A large product is cut into chunks (of rows, columns or the reduction, whichever duplicates
the least operand packing) and each chunk is a single-threaded BLAS call. With OpenBLAS's own
threads in play instead, its idle workers busy-wait for a while after every GEMM and take a
core away from the elementwise passes that follow, which then run markedly slower.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..cpu_pool import MIN_PARALLEL, Blocks
from .reference import GemmReference

_GEMM_CHUNK = 8e6  # multiply-adds in the smallest GEMM chunk worth a BLAS call of its own
_CHUNKS_PER_THREAD = 4  # GEMM chunks per thread: enough for the threads to even out
STREAMED_ROWS = 16  # below this many rows of a, a product streams b from memory: see _gemm


class CpuGemm(GemmReference):
    uses = ("threads", "split_gemms", "_parallel", "blas_threaded")

    def matmul(self, a: Any, b: Any, *, transpose_b: bool = False, out: Any = None,
               accumulate: bool = False, gradient: str | None = None) -> Any:
        """a @ b (into `out` if given, added to it with `accumulate`), a large product spread
        over the pool."""
        if accumulate:
            out += self.matmul(a, b, transpose_b=transpose_b)
            return out
        if transpose_b:
            b = np.swapaxes(b, -1, -2)  # a view: BLAS reads it transposed
        if not self.split_gemms or a.ndim < 2 or b.ndim < 2:
            return np.matmul(a, b, out=out)
        if a.ndim > 2 and b.ndim == 2 and (out is None or out.flags.c_contiguous):
            # (..., M, K) @ (K, N): one GEMM over all the rows (out must reshape as a view)
            if out is None:
                out = np.empty((*a.shape[:-1], b.shape[1]), np.result_type(a, b))
            self._gemm(a.reshape(-1, a.shape[-1]), b, out.reshape(-1, b.shape[1]))
            return out
        if a.ndim == b.ndim == 2:
            if out is None:
                out = np.empty((a.shape[0], b.shape[1]), np.result_type(a, b))
            self._gemm(a, b, out)
            return out
        if a.shape[:-2] == b.shape[:-2]:  # batched: chunks of the leading axis
            if out is None:
                out = np.empty((*a.shape[:-1], b.shape[-1]), np.result_type(a, b))
            macs = a.size * b.shape[-1]
            size = math.ceil(a.shape[0] / self._chunks(macs, a.shape[0]))

            def batches(blocks: Blocks) -> None:
                for i, j in blocks:
                    np.matmul(a[i:j], b[i:j], out=out[i:j])

            self._parallel(batches, a.shape[0], size, macs / _GEMM_CHUNK * MIN_PARALLEL)
            return out
        return np.matmul(a, b, out=out)

    def _chunks(self, macs: float, extent: int) -> int:
        """How many chunks to cut a GEMM into: a few per thread, for balance."""
        return max(1, min(_CHUNKS_PER_THREAD * self.threads, int(macs // _GEMM_CHUNK), extent))

    def _gemm(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        """out = a @ b for 2-D operands. Each chunk packs its own copy of the operand the
        chunks share, so cut the dimension whose sharing costs least: rows of a (b shared),
        columns of b (a shared), or the reduction (partial products summed afterwards)."""
        m, k = a.shape
        n = b.shape[1]
        if m < STREAMED_ROWS:
            # A product of few rows (a decode step's matrix-vector products) reads each
            # element of b for only m multiply-adds: memory, not arithmetic, is its time, and
            # one core cannot draw the caches' bandwidth alone. Cut into the pool's chunks,
            # each a Python call, the many small products of a token cost more than they
            # save (measured: benchmarks/results/generate-cpu-2core.md); BLAS's own threads
            # split each one at no Python cost, so here they do, for this call only.
            with self.blas_threaded():
                np.matmul(a, b, out=out)
            return
        macs = m * n * k
        cost = {"rows": k * n, "cols": m * k, "reduction": m * n}
        split = min(cost, key=cost.__getitem__)
        extent = {"rows": m, "cols": n, "reduction": k}[split]
        chunks = self._chunks(macs, extent // 16)
        if chunks == 1:
            np.matmul(a, b, out=out)
            return
        size = math.ceil(extent / chunks / 16) * 16
        work = macs / _GEMM_CHUNK * MIN_PARALLEL  # in _parallel's units: one thread a chunk

        if split == "rows":
            def rows(blocks: Blocks) -> None:
                for i, j in blocks:
                    np.matmul(a[i:j], b, out=out[i:j])

            self._parallel(rows, m, size, work)
        elif split == "cols":
            def cols(blocks: Blocks) -> None:
                for i, j in blocks:
                    np.matmul(a, b[:, i:j], out=out[:, i:j])

            self._parallel(cols, n, size, work)
        else:
            def partial(blocks: Blocks) -> np.ndarray | None:
                acc = tmp = None
                for i, j in blocks:
                    if acc is None:
                        acc = np.matmul(a[:, i:j], b[i:j])
                    else:
                        tmp = np.matmul(a[:, i:j], b[i:j], out=tmp)
                        acc += tmp
                return acc

            sums = [s for s in self._parallel(partial, k, size, work) if s is not None]
            np.copyto(out, sums[0])
            for s in sums[1:]:
                out += s
