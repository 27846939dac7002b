"""Training progress: rich bars on a terminal, plain periodic lines otherwise (CI, pipes)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TrainingProgress:
    """Epoch and step bars with loss, tokens/s and ETA; updated at every loss read-back.
    An epoch's total is the steps it will run, so MAX_STEPS shortens it."""

    def __init__(self, epochs: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.epochs = epochs
        self.live = self.console.is_terminal
        self._bar: Progress | None = None
        self._task: Any = None

    def start_epoch(self, epoch: int, steps: int, done: int) -> None:
        if not self.live:
            print(f"epoch {epoch + 1}/{self.epochs}: {steps} steps", file=sys.stderr, flush=True)
            return
        if self._bar is None:
            self._bar = Progress(
                TextColumn("[bold]{task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=True,
            )
            self._bar.start()
        if self._task is not None:
            self._bar.remove_task(self._task)
        self._task = self._bar.add_task("train", total=steps, completed=done,
                                        epoch=f"epoch {epoch + 1}/{self.epochs}", loss="-", tps="-")

    def update(self, pos: Any, loss: float, tokens_per_s: float) -> None:
        if not self.live:
            print(f"  step {pos.step} (epoch {pos.epoch + 1}, batch {pos.batch}): loss "
                  f"{loss:.4f}, {tokens_per_s:,.0f} tok/s", file=sys.stderr, flush=True)
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=pos.batch, loss=f"{loss:.4f}",
                             tps=f"{tokens_per_s:,.0f}")

    @contextlib.contextmanager
    def evaluating(self, split: str, tokens: int) -> Iterator[None]:
        """A status line while a split is evaluated (it takes seconds to minutes)."""
        what = f"evaluating the {split} split ({tokens:,} tokens)"
        start = time.perf_counter()
        if not self.live:
            print(f"  {what} ...", file=sys.stderr, flush=True)
            yield
            return
        if self._bar is None:
            with self.console.status(what + " ..."):
                yield
        else:  # one live display at a time: a row of the bars instead
            task = self._bar.add_task("eval", total=None, epoch=what, loss="-", tps="-")
            try:
                yield
            finally:
                self._bar.remove_task(task)
        self.console.print(f"  {what}: {time.perf_counter() - start:.1f}s", highlight=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
