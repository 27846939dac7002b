"""Dropout's reference kernels: the Philox mask (philox.py), and the mask applied."""

from __future__ import annotations

from typing import Any

from ..table import Family
from . import philox


class DropoutReference(Family):

    def dropout_mask(self, shape: tuple[int, ...], dtype: Any, p: float, seed: int, site: int,
                     step: Any) -> Any:
        return philox.dropout_mask(self.xp, shape, dtype, p, seed, site, step)

    def dropout_apply(self, x: Any, p: float, seed: int, site: int, step: Any) -> Any:
        return x * self.dropout_mask(x.shape, x.dtype, p, seed, site, step)
