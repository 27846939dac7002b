"""Dynamic loss scaling for float16 training, with PyTorch GradScaler's rules, on the device.

float16 flushes gradients below ~6e-8 to zero, so backward is seeded with the loss times a
large scale (2**16 to start) and the optimizer divides it out. A step whose gradients
overflowed (a non-finite global norm) is skipped, leaving weights and optimizer state as they
were, and the scale halves; after 2,000 clean steps in a row it doubles. The scale, the clean
step count and the skip count are 0-d device arrays and every decision is an array operation,
so a step never waits for the host and replays as a CUDA graph.

How the optimizer sees it: `factor` folds 1/scale into the grad-clip factor the update kernels
already multiply gradients by, and makes it negative on overflow, which the kernels read as
"skip this step". bfloat16 has float32's exponent range and needs none of this.
"""

from __future__ import annotations

from typing import Any

import numpy as np

INIT_SCALE = 2.0**16
GROWTH_INTERVAL = 2000
STATE_KEYS = ("loss_scale", "loss_scale_clean", "loss_scale_skipped")
# A collapse: this many skipped steps in a row, or a scale below the floor (the gradients
# overflow float16 even shrunk a thousandfold). Training then changes nothing but the scale.
COLLAPSE_STREAK = 32
COLLAPSE_FLOOR = 2.0**-10


class LossScaler:
    """The scale, clean-step count and skipped-step count of a float16 run."""

    def __init__(self, xp: Any, init_scale: float = INIT_SCALE,
                 growth_interval: int = GROWTH_INTERVAL) -> None:
        self.xp, self.growth_interval = xp, growth_interval
        self.scale = xp.full((), init_scale, dtype=np.float32)
        self.clean = xp.zeros((), dtype=np.int32)  # steps since the last overflow or growth
        self.skipped = xp.zeros((), dtype=np.int32)
        self.streak = xp.zeros((), dtype=np.int32)  # skipped steps in a row, up to now
        self.overflow = xp.zeros((), dtype=np.float32)  # 1.0 when the last step was skipped
        self._seed = xp.zeros((), dtype=np.float32)

    def seed(self, shards: int) -> Any:
        """Backward's seed: the scale over the number of shards the loss is averaged over."""
        self.xp.multiply(self.scale, np.float32(1.0 / shards), out=self._seed)
        return self._seed

    def unscaled(self, norm: Any) -> Any:
        """The true gradient norm from the norm of the scaled gradients."""
        return norm / self.scale

    def factor(self, norm: Any, clip: Any | None) -> Any:
        """What the update kernels multiply gradients by: 1/scale (times the clip factor
        `clip`, if clipping), or -1, "skip", when the (unscaled) `norm` is not finite."""
        xp = self.xp
        f = 1.0 / self.scale if clip is None else clip / self.scale
        return xp.where(xp.isfinite(norm), f, np.float32(-1.0)).astype(np.float32)

    def update(self, norm: Any) -> None:
        """After the step: back off and count the skip on overflow, else grow when due."""
        xp = self.xp
        bad = ~xp.isfinite(norm)
        clean = xp.where(bad, 0, self.clean + 1)
        grow = clean >= self.growth_interval
        self.scale[...] = xp.where(bad, self.scale * np.float32(0.5),
                                   xp.where(grow, self.scale * np.float32(2.0), self.scale))
        self.clean[...] = xp.where(grow, 0, clean)
        self.skipped += bad.astype(np.int32)
        self.streak[...] = xp.where(bad, self.streak + 1, 0)
        self.overflow[...] = bad

    def state(self, to_host: Any) -> dict[str, float]:
        """The scale and the number of skipped steps, for the run's record."""
        return {"scale": float(to_host(self.scale)), "skipped": int(to_host(self.skipped))}

    def collapse(self, to_host: Any) -> str | None:
        """What shows the scale has collapsed (None while it has not): read at loss
        read-backs, which synchronise anyway."""
        scale, streak = float(to_host(self.scale)), int(to_host(self.streak))
        if streak >= COLLAPSE_STREAK:
            return f"{streak} steps in a row were skipped for overflowing gradients"
        if scale < COLLAPSE_FLOOR:
            return f"the loss scale fell below {COLLAPSE_FLOOR:.3g}"
        return None

    def state_dict(self, to_host: Any) -> dict[str, np.ndarray]:
        return dict(zip(STATE_KEYS, (to_host(a) for a in self._arrays()), strict=True))

    def load_state_dict(self, state: dict[str, np.ndarray], from_host: Any) -> None:
        """Restore what a checkpoint holds (a run resumed from another precision has none
        and keeps the initial scale)."""
        for key, array in zip(STATE_KEYS, self._arrays(), strict=True):
            if key in state:
                array[...] = from_host(np.asarray(state[key]))

    def _arrays(self) -> tuple[Any, Any, Any]:
        return self.scale, self.clean, self.skipped
