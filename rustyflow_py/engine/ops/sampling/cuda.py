"""The next token on the GPU (sampling.cu): one block per row, one launch per token.

Why kernels of their own: as CuPy array ops a draw is about 40 launches a token (two of
them sorts, of the whole vocabulary or of its partition), each a Python call, and CuPy's
argmax of one row is a single block reading it one element per thread at a time. At batch 1
that, not the decode step, set the speed of sampled generation. The kernel reads the row a few
times from L2 instead: its maximum, a radix select of the k-th largest logit, the kept mass,
and the draw; only the entries above the k-th largest are sorted (for top-p).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import cuda_build
from .reference import SamplingReference

THREADS = 1024  # sampling.cu's block size (it needs exactly 32 warps)
KEPT_MAX = 1024  # top-p with top-k sorts fewer than top_k <= this many entries
_DEFINES = (f"-DTHREADS={THREADS}", f"-DKEPT_MAX={KEPT_MAX}")
_SAMPLING = cuda_build.source(__file__, "sampling.cu",
                              cuda_build.dtype_defines(np.float32) + _DEFINES)


class CudaSampling(SamplingReference):

    def argmax_rows(self, logits: Any) -> Any:
        logits = self.xp.ascontiguousarray(logits)
        b, v = logits.shape
        ids = self.xp.empty(b, dtype=np.int64)
        _SAMPLING.typed("argmax_rows", logits.dtype, defines=_DEFINES)(
            (b,), (THREADS,), (logits, ids, np.int32(v)))
        return ids

    def sample_rows(self, logits: Any, u: Any, temperature: float, top_k: int,
                    top_p: float) -> Any:
        """sampling.cu, except top-p without a top-k of at most KEPT_MAX (the nucleus would
        need the whole vocabulary sorted): the reference's array ops then."""
        b, v = logits.shape
        if top_p < 1.0 and not 0 < top_k <= min(KEPT_MAX, v - 1):
            return super().sample_rows(logits, u, temperature, top_k, top_p)
        logits = self.xp.ascontiguousarray(logits)
        u = self.xp.ascontiguousarray(u, dtype=np.float64)
        ids = self.xp.empty(b, dtype=np.int64)
        _SAMPLING.typed("sample_rows", logits.dtype, defines=_DEFINES)(
            (b,), (THREADS,), (logits, u, ids, np.int32(v), np.float64(temperature),
                               np.int32(top_k), np.float64(top_p)))
        return ids
