"""Which weight average a run keeps for evaluation and its best checkpoint (model/ema.py)."""

from __future__ import annotations

from typing import Any

from ...model.ema import EMA
from ...model.params import ParameterBuffer
from ...model.snapshots import SnapshotAverage
from ..config.config import Config


def averager_for(cfg: Config, buffer: ParameterBuffer) -> Any:
    """EMA_DECAY > 0: the EMA; AVERAGE_LAST_K > 1: the last K validations' mean (the config
    refuses both at once); else None (the raw weights are evaluated)."""
    if cfg.ema_decay > 0:
        return EMA(buffer, cfg.ema_decay, cfg.ema_start)
    if cfg.average_last_k > 1:
        return SnapshotAverage(buffer, cfg.average_last_k)
    return None
