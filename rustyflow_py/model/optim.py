"""Optimizers over a flat parameter buffer: AdamW (default) and SGD with momentum/Nesterov.

The learning-rate schedule, the step count and the global grad-norm clip all stay in
device memory (0-d arrays), so a step needs no host value and can be replayed as a graph.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..engine.tensor import run_op
from .params import ParameterBuffer


class Schedule:
    """Linear warm-up to `lr` over `warmup` steps, then cosine decay to lr*min_ratio."""

    def __init__(self, lr: float, warmup: int, total: int, min_ratio: float) -> None:
        self.lr, self.warmup, self.total, self.min_ratio = lr, warmup, max(total, 1), min_ratio

    def __call__(self, step: Any, xp: Any = np) -> Any:
        """LR (float32) for the 1-based `step`, an int or a 0-d array of module `xp`."""
        s = xp.asarray(step).astype(np.float32)
        warm = s / max(self.warmup, 1)
        span = max(self.total - self.warmup, 1)
        progress = xp.clip((s - self.warmup) / span, 0.0, 1.0)
        floor = self.min_ratio * self.lr
        decay = floor + (self.lr - floor) * 0.5 * (1.0 + xp.cos(math.pi * progress))
        return xp.where(s <= self.warmup, self.lr * warm, decay).astype(np.float32)


class Optimizer:
    """Shared machinery: device-side step counter, grad-norm clipping, state (de)serialisation."""

    state_names: tuple[str, ...] = ()

    def __init__(self, buffer: ParameterBuffer, schedule: Schedule, grad_clip: float) -> None:
        self.buffer, self.schedule, self.grad_clip = buffer, schedule, grad_clip
        xp = buffer.backend.xp
        self.xp = xp
        self.step_count = xp.zeros((), dtype=np.int32)  # lives on the device
        self.grad_norm = xp.zeros((), dtype=np.float32)
        self.lr = xp.zeros((), dtype=np.float32)
        self.kernels = buffer.backend.kernels

    def clip_scale(self) -> Any:
        """Global grad-norm (kept for logging) and the factor that clips it to grad_clip."""
        g = self.buffer.grad
        self.grad_norm[...] = run_op("grad_norm", "other", "optimizer", self.kernels.l2_norm, g)
        if self.grad_clip <= 0:
            return None
        return self.xp.minimum(1.0, self.grad_clip / (self.grad_norm + 1e-6))

    def step(self) -> None:
        self.step_count += 1
        self.lr[...] = self.schedule(self.step_count, self.xp)
        self._update(self.clip_scale())

    def _update(self, scale: Any) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, np.ndarray]:
        to_host = self.buffer.backend.to_host
        state = {name: to_host(getattr(self, name)) for name in self.state_names}
        state["step_count"] = to_host(self.step_count)
        return state

    def state_sizes(self) -> dict[str, int]:
        """Element count of each state array, as state_dict() names them."""
        sizes = {name: int(getattr(self, name).size) for name in self.state_names}
        return {**sizes, "step_count": 1}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        from_host = self.buffer.backend.from_host
        for name in (*self.state_names, "step_count"):
            if name not in state:
                raise ValueError(f"optimizer state lacks {name!r}: saved by another optimizer?")
            getattr(self, name)[...] = from_host(np.asarray(state[name]))


class AdamW(Optimizer):
    """Decoupled weight decay Adam (Loshchilov & Hutter), PyTorch's update order."""

    state_names = ("m", "v")

    def __init__(
        self, buffer: ParameterBuffer, schedule: Schedule, betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8, weight_decay: float = 0.1, grad_clip: float = 1.0,
    ) -> None:
        super().__init__(buffer, schedule, grad_clip)
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        self.m = self.xp.zeros_like(buffer.flat)
        self.v = self.xp.zeros_like(buffer.flat)

    def _update(self, scale: Any) -> None:
        b = self.buffer
        run_op("adamw", "other", "optimizer", self.kernels.adamw, b.flat, b.grad, self.m, self.v,
               self.lr, self.step_count, scale, self.betas, self.eps, self.weight_decay,
               b.decay_size)


class SGD(Optimizer):
    """SGD with optional (Nesterov) momentum and decoupled weight decay on matrices."""

    state_names = ("velocity",)

    def __init__(
        self, buffer: ParameterBuffer, schedule: Schedule, momentum: float = 0.0,
        nesterov: bool = False, weight_decay: float = 0.0, grad_clip: float = 1.0,
    ) -> None:
        super().__init__(buffer, schedule, grad_clip)
        if nesterov and momentum <= 0:
            raise ValueError("NESTEROV=true needs MOMENTUM > 0")
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay
        self.velocity = self.xp.zeros_like(buffer.flat)

    def _update(self, scale: Any) -> None:
        b = self.buffer
        run_op("sgd", "other", "optimizer", self.kernels.sgd, b.flat, b.grad, self.velocity,
               self.lr, scale, self.momentum, self.nesterov, self.weight_decay, b.decay_size)
