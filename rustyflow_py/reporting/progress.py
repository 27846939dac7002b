"""Training and evaluation progress: one live region on a terminal, plain lines otherwise.

On a terminal, one rich Progress (a Live display) owns the bottom of the screen: the epoch's
bar, and below it an evaluation bar while a split is evaluated. Everything else the run says
goes through `say`/`warn`, which print finished lines above that region, so no line is glued
to a bar or overwritten by it. When stderr is not a terminal (CI, a pipe, a file) there is no
live region and no control code: progress is a plain line every LOG_INTERVAL steps.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .text import plural

Advance = Callable[[int], None]


class TrainingProgress:
    """The epoch bar (loss, tokens/s, ETA; its total is the steps this epoch will run, so
    MAX_STEPS shortens it), the evaluation bar (scored tokens, tokens/s) and the run's lines."""

    def __init__(self, epochs: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.epochs = epochs
        self.live = self.console.is_terminal
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._shown_step: int | None = None  # the step of the last plain progress line

    # ---- lines above the live region ---------------------------------------------------------
    def say(self, message: str) -> None:
        """A result line (stdout). On a terminal it goes above the live region; stdout sent
        to a file or pipe gets it as it is."""
        if self._bar is not None and sys.stdout.isatty():
            self.console.print(message, markup=False, highlight=False)
        else:
            click.echo(message)

    def warn(self, message: str) -> None:
        """A warning line (stderr), above the live region when there is one."""
        if self._bar is not None:
            self.console.print(message, markup=False, highlight=False)
        else:
            click.echo(message, err=True)

    # ---- the bars ---------------------------------------------------------------------------
    def _region(self) -> Progress:
        if self._bar is None:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                TimeRemainingColumn(), console=self.console,
                redirect_stdout=sys.stdout.isatty(),  # stdout to a file stays in the file
            )
            self._bar.start()
        return self._bar

    def start_epoch(self, epoch: int, steps: int, done: int) -> None:
        label = f"epoch {epoch + 1}/{self.epochs}"
        if not self.live:
            click.echo(f"{label}: {plural(steps - done, 'step')}", err=True)
            return
        bar = self._region()
        if self._task is not None:
            bar.remove_task(self._task)
        self._task = bar.add_task(label, total=steps, completed=done, detail="loss -")

    def update(self, pos: Any, loss: float, tokens_per_s: float) -> None:
        """At a loss read-back: the epoch's batch, the latest loss and the run's tokens/s."""
        detail = f"loss {loss:.4f}  {tokens_per_s:,.0f} tok/s"
        if not self.live:
            if pos.step == self._shown_step:  # the epoch's end re-reads the step just shown
                return
            self._shown_step = pos.step
            click.echo(f"  step {pos.step} (epoch {pos.epoch + 1}, batch {pos.batch}): "
                       f"{detail}", err=True)
        elif self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=pos.batch, detail=detail)

    @contextlib.contextmanager
    def evaluating(self, split: str, tokens: int) -> Iterator[Advance]:
        """An evaluation bar over the `tokens` to be scored; yields `advance(n)`. The line
        it leaves says how many tokens were scored, in how long."""
        start = time.perf_counter()
        done = [0]
        if not self.live:
            click.echo(f"  evaluating {split}: {plural(tokens, 'token')} ...", err=True)
            yield lambda n: done.__setitem__(0, done[0] + n)
        else:
            bar = self._region()
            task = bar.add_task(f"eval {split}", total=tokens, detail="- tok/s")

            def advance(n: int) -> None:
                done[0] += n
                rate = done[0] / max(time.perf_counter() - start, 1e-9)
                bar.update(task, completed=done[0], detail=f"{rate:,.0f} tok/s")

            try:
                yield advance
            finally:
                bar.remove_task(task)
        took = time.perf_counter() - start
        self.warn(f"  evaluated {split}: {plural(done[0], 'token')} in {took:.1f}s "
                  f"({done[0] / max(took, 1e-9):,.0f} tok/s)")

    def close(self) -> None:
        """Stop the live region; its last state (the epoch bar) stays on the screen."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self._task = None
