"""The host<->device copies that count as the training steps' own traffic."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ...engine.backend import Backend


class TransferLedger:
    """The host<->device copies of the training steps alone: evaluation and checkpoint copies
    are set aside, so the report's per-step traffic is the step's own."""

    def __init__(self, backend: Backend) -> None:
        self.transfers = backend.transfers
        self.aside = dict.fromkeys(self.transfers.snapshot(), 0)

    def reset(self) -> None:
        self.transfers.reset()
        self.aside = dict.fromkeys(self.aside, 0)

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[None]:
        """Copies made inside do not count as step traffic."""
        before = self.transfers.snapshot()
        try:
            yield
        finally:
            for key, value in self.transfers.snapshot().items():
                self.aside[key] += value - before[key]

    def steps(self) -> dict[str, int]:
        return {k: v - self.aside[k] for k, v in self.transfers.snapshot().items()}
