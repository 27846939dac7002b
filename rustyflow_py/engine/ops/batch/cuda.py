"""The batch gather and the loss ring on the GPU (batch.cu): a step's data moves without the
host."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import cuda_build
from .reference import BatchReference, windows

_BATCH = cuda_build.source(__file__, "batch.cu", cuda_build.dtype_defines(np.float32))


class CudaBatch(BatchReference):
    def gather_batch(self, stream: Any, step: Any, seq_len: int, x: Any, y: Any, *,
                     rank: int = 0, world_size: int = 1, shift: int | None = None) -> None:
        """x, y <- the window of batch (step mod batches-per-epoch), without the host."""
        row0 = self._shard_start(stream, x, rank, world_size)
        b, n = x.shape[0], stream.shape[1]
        nb = windows(n, seq_len, shift is not None)
        total = b * seq_len
        _BATCH.typed("gather_batch", np.dtype(np.float32))(
            ((total + 255) // 256,), (256,),
            (stream, step, x, y, np.int32(row0), np.int32(b), np.int32(n), np.int32(seq_len),
             np.int32(nb), np.int32(shift is not None), np.uint32((shift or 0) & 0xFFFFFFFF)))

    def store_at_step(self, ring: Any, step: Any, value: Any) -> None:
        value = self.xp.ascontiguousarray(value, dtype=ring.dtype)
        _BATCH.typed("store_at_step", ring.dtype)((1,), (1,),
                                                  (ring, step, value, np.int32(len(ring))))
