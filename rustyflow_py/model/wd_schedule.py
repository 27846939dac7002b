"""WD_SCHEDULE: decoupled weight decay that changes over the run (linear or cosine).

Regularisation wants differ over a run: strong decay early keeps small-data models from
memorising, while late in the run (the learning rate annealing to zero) it mostly pulls the
weights off the minimum the schedule is settling into; the opposite ramp is also used. The
schedule goes from WEIGHT_DECAY at step 0 to WD_FINAL at the last step.

Decoupled decay is p <- p * (1 - lr * wd) before the update (AdamW's order, as in
torch.optim.AdamW), independent of the gradient, so a scheduled decay is one in-place pass
over the decayed part of the buffer ahead of the optimizer's own kernel (run with decay 0),
its value computed on the device from the step counter: the step stays capturable.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class DecaySchedule:
    """wd(step) from `start` to `final` over `total` steps, `kind` linear or cosine."""

    def __init__(self, kind: str, start: float, final: float, total: int) -> None:
        if kind not in ("linear", "cosine"):
            raise ValueError(f"weight-decay schedule must be linear or cosine, not {kind!r}")
        self.kind, self.start, self.final, self.total = kind, start, final, max(total, 1)

    def __call__(self, step: Any, xp: Any = np) -> Any:
        """The decay (float32) at the 1-based `step`, an int or a 0-d array of module `xp`."""
        progress = xp.clip(xp.asarray(step).astype(np.float32) / self.total, 0.0, 1.0)
        left = (1.0 - progress if self.kind == "linear"
                else 0.5 * (1.0 + xp.cos(math.pi * progress)))
        return (self.final + (self.start - self.final) * left).astype(np.float32)

    def apply(self, optimizer: Any, scale: Any) -> None:
        """Decay the optimizer's decayed ranges by (1 - lr * wd(step)), each with its own
        learning rate (Muon's matrices take MUON_LR's); none on a step the loss scaler
        skips (scale < 0)."""
        xp, flat = optimizer.xp, optimizer.buffer.flat
        wd = self(optimizer.step_count, xp)
        for start, stop, lr in optimizer.decay_regions():
            factor = 1.0 - lr * wd
            if optimizer.loss_scaler is not None:
                factor = xp.where(scale < 0, np.float32(1.0), factor)
            flat[start:stop] *= factor.astype(flat.dtype)
