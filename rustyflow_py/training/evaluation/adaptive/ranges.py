"""The range check of an adaptation hyperparameter, worded as the command line's option."""

from __future__ import annotations

import math

from ....errors import ConfigError


def check_range(option: str, value: float, low: float, high: float = math.inf) -> None:
    """A ConfigError naming `option` unless `low` <= `value` <= `high` (and finite)."""
    if not (math.isfinite(value) and low <= value <= high):
        span = f"at least {low:g}" if high == math.inf else f"from {low:g} to {high:g}"
        raise ConfigError(f"{option} {value:g} is out of range: pass a value {span}")
