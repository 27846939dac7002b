"""AVERAGE_LAST_K: the mean of the weights at the last K validations (checkpoint averaging).

Each validation (every epoch's end, or every EVAL_INTERVAL steps) first adds the current
weights to a ring of K host copies, then measures the mean of the ring; the best checkpoint
is that mean. The mean is summed in float64 in the ring's order of arrival and rounded once
to the storage dtype, so it is exactly reproducible (tests hold it to NumPy). The ring lives
on the host (K copies of the parameters; the device holds only their mean) and is saved
with the resumable checkpoint, so `--resume` continues the same average.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from .ema import swapped_in
from .params import ParameterBuffer


def mean_of(snapshots: list[np.ndarray], dtype: Any) -> np.ndarray:
    """The element-wise mean of equal-shaped arrays: float64 sum in order, one rounding."""
    total = np.zeros(snapshots[0].shape, dtype=np.float64)
    for s in snapshots:
        total += s
    total /= len(snapshots)
    return total.astype(dtype)


class SnapshotAverage:
    """The last `k` validations' weights (oldest first) and their mean."""

    def __init__(self, buffer: ParameterBuffer, k: int) -> None:
        self.buffer, self.k = buffer, k
        self.ring: list[np.ndarray] = []  # (P,) host copies, oldest first
        self.mean: Any = None  # (P,) the ring's mean on the device, made at each validation

    def describe(self) -> str:
        return (f"mean of the weights at the last {len(self.ring) or self.k} validations "
                f"(AVERAGE_LAST_K={self.k})")

    def after_step(self, step: Any) -> None:
        """Nothing inside the step: snapshots are taken at validations."""

    def at_validation(self) -> None:
        """Add the current weights to the ring (dropping the oldest beyond k) and put the
        ring's mean on the device (the host<->device copies of a validation)."""
        self.ring.append(self.buffer.backend.to_host(self.buffer.flat).copy())
        del self.ring[: -self.k]
        self.mean = self.buffer.backend.from_host(mean_of(self.ring, self.buffer.flat.dtype))

    def swapped_in(self) -> contextlib.AbstractContextManager[None]:
        if not self.ring:  # nothing validated yet: the raw weights are the only ones
            return contextlib.nullcontext()
        if self.mean is None:  # resumed, not validated since
            self.mean = self.buffer.backend.from_host(mean_of(self.ring,
                                                              self.buffer.flat.dtype))
        return swapped_in(self.buffer, self.mean)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {f"snapshot.{i}": s for i, s in enumerate(self.ring)}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> bool:
        """Load the saved ring (its last k); False when `state` holds none."""
        saved = [state[f"snapshot.{i}"] for i in range(len(state))
                 if f"snapshot.{i}" in state]
        self.ring = [s.astype(self.buffer.flat.dtype) for s in saved][-self.k:]
        self.mean = None
        return bool(saved)
