"""The data movement kernels: their contract, and their entries in the kernel table.

Every device's kernel for an op takes exactly these arguments and keeps these rules (and
table.py's common ones); tests/test_kernel_contract.py holds each to the reference.

    gather_batch(stream, step, seq_len, x, y, *, rank: int = 0, world_size: int = 1,
                 shift: int | None = None) -> None
        Fill x, y (B, T=seq_len) in place with batch (step mod batches-per-epoch) of the
        (world_size * B, N) token stream: rows [rank * B, (rank + 1) * B) are this rank's
        streams, x the window of T tokens and y the same shifted by one. step is a 0-d int32
        device counter. With `shift` (a seed), row r of epoch e = step // batches-per-epoch
        is read from offset epoch_offsets(shift, e, r) in [0, T), and an epoch has
        windows(N, T, shifted=True) batches (reference.py).

    store_at_step(ring, step, value) -> None
        ring[(step - 1) mod len(ring)] = value in place, for a 0-d device counter `step` and
        a 0-d value (the loss).
"""

from __future__ import annotations

from ..table import ANY, declare
from .cuda import CudaBatch
from .reference import BatchReference

declare(("gather_batch", "store_at_step"), reference={ANY: BatchReference},
        cpu={ANY: BatchReference}, gpu={ANY: CudaBatch})
