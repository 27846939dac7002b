"""Data movement on the device: the batch gather and the loss ring that let a whole step
run without the host (reference kernels)."""

from __future__ import annotations

from typing import Any

from ..table import Family


class BatchReference(Family):

    def gather_batch(self, stream: Any, step: Any, seq_len: int, x: Any, y: Any, *,
                     rank: int = 0, world_size: int = 1) -> None:
        first = self._shard_start(stream, x, rank, world_size)
        rows = stream[first : first + x.shape[0]]  # (B, N): this rank's streams
        i = int(step) % ((stream.shape[1] - 1) // seq_len)
        x[...] = rows[:, i * seq_len : (i + 1) * seq_len]
        y[...] = rows[:, i * seq_len + 1 : (i + 1) * seq_len + 1]

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
