"""Data movement on the device: the batch gather and the loss ring that let a whole step
run without the host (reference kernels)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..table import Family


def windows(n: int, seq_len: int, shifted: bool) -> int:
    """Batches an epoch in stream rows of n tokens (data.num_batches' count, which the engine
    layer cannot import): each window takes seq_len + 1 tokens, after an offset of up to
    seq_len - 1 when shifted."""
    return (n - 1 - (seq_len - 1 if shifted else 0)) // seq_len


def epoch_offsets(shift: int, epoch: int, rows: Any, seq_len: int) -> Any:
    """Each stream row's offset in [0, seq_len) for `epoch`: a 32-bit integer hash of (shift,
    epoch, row) (Wellons' lowbias32 finaliser), the same bits as batch.cu's `row_offset`.
    `rows` are global row numbers, so every world size reads the same windows."""
    with np.errstate(over="ignore"):
        h = (np.uint32(shift & 0xFFFFFFFF) * np.uint32(0x9E3779B1)
             ^ np.uint32(epoch) * np.uint32(0x85EBCA77)
             ^ np.asarray(rows, np.uint32) * np.uint32(0xC2B2AE3D))
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x7FEB352D)
        h ^= h >> np.uint32(15)
        h *= np.uint32(0x846CA68B)
        h ^= h >> np.uint32(16)
    return (h % np.uint32(seq_len)).astype(np.int64)


class BatchReference(Family):

    def gather_batch(self, stream: Any, step: Any, seq_len: int, x: Any, y: Any, *,
                     rank: int = 0, world_size: int = 1, shift: int | None = None) -> None:
        first = self._shard_start(stream, x, rank, world_size)
        nb = windows(stream.shape[1], seq_len, shift is not None)
        epoch, i = divmod(int(step), nb)
        rows = np.arange(first, first + x.shape[0])  # this rank's global rows
        offsets = 0 if shift is None else epoch_offsets(shift, epoch, rows, seq_len)[:, None]
        cols = self.xp.asarray(i * seq_len + offsets + np.arange(seq_len))  # (B, T)
        rows = self.xp.asarray(rows[:, None])
        x[...] = stream[rows, cols]
        y[...] = stream[rows, cols + 1]

    @staticmethod
    def _shard_start(stream: Any, x: Any, rank: int, world_size: int) -> int:
        """The first stream row of `rank`'s B = len(x) streams, in a stream of world_size * B
        (host-side shapes only: nothing waits for the device)."""
        b = x.shape[0]
        if stream.shape[0] != world_size * b or not 0 <= rank < world_size:
            raise ValueError(f"gather_batch: rank {rank} of {world_size} with {b} rows each, "
                             f"but the stream has {stream.shape[0]} rows")
        return rank * b

    def store_at_step(self, ring: Any, step: Any, value: Any) -> None:
        ring[(int(step) - 1) % len(ring)] = value
