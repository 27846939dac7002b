"""The run's clock: which of its wall time is training time.

Every time figure a run reports (epoch times, tokens/s, the epoch estimate) counts its training
steps only. Evaluation and checkpoint writes are timed apart (`timed`), and so is the GPU
start-up (the warm-up step, which compiles the kernels, and the graph capture: the step
runner's `startup`), so that a cold kernel cache and a warm one report the same epoch time.

Tokens/s (the live step lines and the run's summary) reads the same clock as the epochs: the
training time is the sum of this process's epoch clocks, each from its epoch's start to its
end, so whatever runs between epochs or after the last one (validation, the checkpoint, the
stop agreement, the test evaluation, the waits that come with them on other ranks) is never
training time, and tokens / training time agrees with the epoch time by construction.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any


class RunClock:
    """Training time of one run, read from the step runner's timers (`phases`, `startup`)."""

    def __init__(self, runner: Any, synchronize: Callable[[], None], step: int) -> None:
        self.runner, self.synchronize = runner, synchronize
        self.run_start = self.epoch_start = time.perf_counter()
        self.marks = (0.0, 0.0, step)  # start-up, aside time and step at the epoch's start
        self.first_step = step  # the step this process started at (a resume's)
        self.aside_in_run = 0.0  # evaluation and checkpoint time inside the run's train_time
        self.carried = 0.0  # the open epoch's time before a resume (another process's)
        self.closed = (0.0, 0)  # the ended epochs' own time and steps, this process's
        self.open = True  # an epoch is running (start_epoch .. epoch_time)
        self.trained = (0.0, 0)  # training seconds and steps counted, fixed by end_run

    @property
    def startup_s(self) -> float:
        """The GPU start-up so far (warm-up step and capture)."""
        return self.runner.startup["first_step_s"] + self.runner.startup["capture_s"]

    @property
    def aside_s(self) -> float:
        """The run's time outside its training steps so far: evaluation, checkpoint writes."""
        return self.runner.phases["eval"] + self.runner.phases["checkpoint"]

    @property
    def startup_steps(self) -> int:
        """How many of this process's steps ran inside the start-up."""
        up = self.runner.startup
        return int(up["first_step_s"] > 0) + int(up["capture_s"] > 0)

    def start_run(self) -> float:
        """The run starts now; returns the time."""
        self.run_start = time.perf_counter()
        return self.run_start

    def end_run(self, step: int) -> None:
        """The run's train_time is taken now (the final checkpoint write comes after it);
        `step`: the steps done. Fixes `trained`."""
        self.aside_in_run = self.aside_s
        self.trained = self.training(step)

    def start_epoch(self, step: int, elapsed: float = 0.0) -> None:
        """An epoch starts (or goes on, `elapsed` seconds of it done before a resume)."""
        self.epoch_start = time.perf_counter() - elapsed
        self.marks = (self.startup_s, self.aside_s, step)
        self.carried, self.open = elapsed, True

    def epoch_clock(self) -> float:
        """The current epoch's time so far, less its evaluation, checkpoint writes and
        start-up."""
        startup, aside, _ = self.marks
        return (time.perf_counter() - self.epoch_start - (self.aside_s - aside)
                - (self.startup_s - startup))

    def epoch_time(self, step: int) -> float:
        """The epoch that ends at `step`: its clock, with the steps that ran inside the
        start-up counted at the epoch's own step time."""
        clock, (startup, _, first) = self.epoch_clock(), self.marks
        if self.open:
            seconds, steps = self.closed
            self.closed = (seconds + clock - self.carried, steps + step - first)
            self.open = False
        if self.startup_s - startup <= 0:
            return clock
        steps = step - first
        counted = steps - self.startup_steps
        return clock * steps / counted if counted > 0 else clock

    def training(self, step: int) -> tuple[float, int]:
        """This process's training time so far (its epochs' own clocks) and the steps it
        counts (those run inside the start-up are not: their time is the start-up's); `step`:
        the steps done (read after a sync)."""
        seconds, steps = self.closed
        if self.open:
            seconds += self.epoch_clock() - self.carried
            steps += step - self.marks[2]
        return seconds, max(steps - self.startup_steps, 0)

    def tokens_per_s(self, steps: int, tokens_per_step: int) -> float:
        """Throughput of this process's `steps` so far: the counted steps' tokens over the
        training time (read after a sync)."""
        seconds, counted = self.training(self.first_step + steps)
        return counted * tokens_per_step / max(seconds, 1e-9)

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[None]:
        """Time spent inside goes to `what` (eval, checkpoint), never to the training steps,
        also when it is interrupted. The device finishes the queued steps first: waiting for
        them is training time."""
        self.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.runner.phases[what] += time.perf_counter() - start
