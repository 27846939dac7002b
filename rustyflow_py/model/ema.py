"""Weight averaging for evaluation: an exponential moving average of the weights (EMA_DECAY),
and the average of the weights at the last K validations (AVERAGE_LAST_K).

On small data the weights a run ends at are noisy (each step moves them by one batch's view
of the data), and an average over the last part of the trajectory generalises better than
any single point of it (Polyak averaging; checkpoint averaging in Vaswani et al. 2017). The
average is what validation measures, what the best checkpoint holds and what the test
evaluates; training itself keeps stepping the raw weights.

The EMA is a second flat buffer of the parameters' storage dtype (float32 under mixed
precision: it averages the master weights) on the device, updated by one kernel after every
optimizer step, inside the step (and so inside its CUDA graph): the step counter it reads is
the optimizer's device counter, so nothing waits for the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..engine.tensor import run_op
from .params import ParameterBuffer


@contextlib.contextmanager
def swapped_in(buffer: ParameterBuffer, flat: Any) -> Iterator[None]:
    """Inside, the model's parameters hold `flat` (P,); the raw weights come back after. The
    buffer's memory is written in place, so a captured step graph stays valid."""
    raw = buffer.flat.copy()
    buffer.flat[...] = flat
    buffer.sync_compute()
    try:
        yield
    finally:
        buffer.flat[...] = raw
        buffer.sync_compute()


class EMA:
    """ema <- ema + (1 - decay) * (w - ema) after each step past `start` (ema = w up to it)."""

    def __init__(self, buffer: ParameterBuffer, decay: float, start: int = 0) -> None:
        self.buffer, self.decay, self.start = buffer, decay, start
        self.flat = buffer.flat.copy()  # (P,) the storage dtype, on the device

    def describe(self) -> str:
        return f"EMA of the weights (EMA_DECAY={self.decay:g}, from step {self.start})"

    def after_step(self, step: Any) -> None:
        """Fold in the weights of the step just taken (`step`: steps done, a 0-d device
        counter). Called inside the step: no host read."""
        run_op("ema_update", "other", "optimizer", self.buffer.backend.kernels.ema_update,
               self.flat, self.buffer.flat, self.decay, step, self.start)

    def at_validation(self) -> None:
        """Nothing to do: the EMA is current after every step."""

    def swapped_in(self) -> contextlib.AbstractContextManager[None]:
        return swapped_in(self.buffer, self.flat)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"ema": self.buffer.backend.to_host(self.flat)}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> bool:
        """Load the saved average; False when `state` holds none (it then starts from the
        current weights)."""
        saved = state.get("ema")
        if saved is None or saved.shape != self.flat.shape:
            self.flat[...] = self.buffer.flat
            return False
        self.flat[...] = self.buffer.backend.from_host(saved.astype(self.flat.dtype))
        return True
