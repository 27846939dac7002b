"""The run's clock: which of its wall time is training time.

Every time figure a run reports (epoch times, tokens/s, the epoch estimate) counts its training
steps only. Evaluation and checkpoint writes are timed apart (`timed`), and so is the GPU
start-up (the warm-up step, which compiles the kernels, and the graph capture: the step
runner's `startup`), so that a cold kernel cache and a warm one report the same epoch time.
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
        self.aside_in_run = 0.0  # evaluation and checkpoint time inside the run's train_time

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

    def end_run(self) -> None:
        """The run's train_time is taken now (the final checkpoint write comes after it)."""
        self.aside_in_run = self.aside_s

    def start_epoch(self, step: int, elapsed: float = 0.0) -> None:
        """An epoch starts (or goes on, `elapsed` seconds of it done before a resume)."""
        self.epoch_start = time.perf_counter() - elapsed
        self.marks = (self.startup_s, self.aside_s, step)

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
        if self.startup_s - startup <= 0:
            return clock
        steps = step - first
        counted = steps - self.startup_steps
        return clock * steps / counted if counted > 0 else clock

    def tokens_per_s(self, steps: int, tokens_per_step: int) -> float:
        """Throughput of this process's `steps` so far (read after a sync)."""
        elapsed = time.perf_counter() - self.run_start - self.aside_s - self.startup_s
        counted = steps - self.startup_steps
        return max(counted, 0) * tokens_per_step / max(elapsed, 1e-9)

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
