"""The reference step kernels: the optimizer updates over the flat parameter buffer, and the
device-side batch gather and loss ring that let a whole step run without the host.

Split from reference.py (the op kernels) only to keep each class short; XpKernels inherits
these, and every backend's kernel set therefore has them.
"""

from __future__ import annotations

from typing import Any


class StepKernels:
    """Optimizer and data kernels written once against `self.xp` (NumPy or CuPy)."""

    xp: Any

    # ---- optimizer kernels over the flat parameter buffer ------------------------------------
    def l2_norm(self, g: Any) -> Any:
        return self.xp.sqrt(self.xp.dot(g, g))

    def adamw(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        xp = self.xp
        b1, b2 = betas
        if scale is not None:
            g = g * scale.astype(g.dtype)
        t = step.astype(p.dtype)
        if weight_decay:
            p[:decay_size] *= 1.0 - lr * weight_decay
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        v += (1.0 - b2) * (g * g)
        denom = xp.sqrt(v)
        denom /= xp.sqrt(1.0 - b2**t)
        denom += eps
        p -= (lr / (1.0 - b1**t)).astype(p.dtype) * m / denom

    def sgd(
        self, p: Any, g: Any, velocity: Any, lr: Any, scale: Any, momentum: float,
        nesterov: bool, weight_decay: float, decay_size: int,
    ) -> None:
        if scale is not None:
            g = g * scale.astype(g.dtype)
        if weight_decay:
            p[:decay_size] *= 1.0 - lr * weight_decay
        d = g
        if momentum:
            velocity *= momentum
            velocity += g
            d = g + momentum * velocity if nesterov else velocity
        p -= lr.astype(p.dtype) * d

    # ---- data -------------------------------------------------------------------------------
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
