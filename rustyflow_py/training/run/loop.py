"""The training loop: a thin driver over the step runner, evaluation, checkpoints and the log.

The run's parts are built and checked before any work (parts.py), and its end is written
by outputs/finish.py. A stop request (Ctrl-C, SIGTERM, SIGUSR1) finishes the current step, then
writes a checkpoint and an "interrupted" log block, so `--resume` continues exactly.
"""

from __future__ import annotations

import dataclasses
import signal
import tempfile
import time
from typing import Any

import numpy as np

from ...distributed.group import process_group
from ...distributed.world import World
from ...errors import ConfigError, TrainingError, command
from ...reporting.record_schema import RunRecord
from ...reporting.text import plural
from ..config.config import Config
from ..outputs import guard
from ..outputs.finish import finish
from . import hooks
from .parts import RunParts, Say, silent
from .signals import FINAL, WRITES, Stopped
from .state import LoopState
from .step import quiet_float_errors


class Trainer:
    """One training run of `cfg` on one device; `run()` returns the run record. Its parts
    (`parts`: device, model, optimizer, step runner, checkpoints, ...) are built and checked
    from `cfg` and `options`, RunParts' keywords (resume, progress, warn, trace, group, world,
    overwrite, init_from, allow_data_change), before any work. The loop drives them and keeps
    its own `state`: epochs of steps, validation, early stopping, stop requests, and the
    resumable checkpoint at each epoch end."""

    def __init__(self, cfg: Config, say: Say = print, **options: Any) -> None:
        self.parts = RunParts(cfg, say, **options)
        self.state = LoopState(start_step=self.parts.pos.step)

    # What callers drive or inspect around a run (the rest: `parts`, `state`).
    cfg = property(lambda self: self.parts.cfg)
    device = property(lambda self: self.parts.device)
    backend = property(lambda self: self.parts.backend)
    model = property(lambda self: self.parts.model)
    optimizer = property(lambda self: self.parts.optimizer)
    comm = property(lambda self: self.parts.comm)
    runner = property(lambda self: self.parts.runner)
    profiler = property(lambda self: self.parts.profiler)
    history = property(lambda self: self.parts.history)
    losses = property(lambda self: self.parts.losses)
    checkpoint_path = property(lambda self: self.parts.checkpoint_path)

    # ---- the run -----------------------------------------------------------------------------
    def run(self) -> RunRecord | None:
        """See _run; the checkpoint lock is released at the end, however the run ends."""
        try:
            return self._run()
        finally:
            if self.parts.lock is not None:
                self.parts.lock.release()

    def _run(self) -> RunRecord | None:
        """Train, evaluate, save, log. Returns the record (None if nothing was left to do, and
        on every data-parallel process but rank 0);
        raises Stopped after an interrupted run and TrainingError after a failed one, both
        once the checkpoint and the log block are written."""
        p, state = self.parts, self.state
        if p.pos.step >= p.limit:
            p.say(nothing_left(p.cfg, p.pos.step, p.total_steps))
            return None
        status, message, stop = "completed", None, None
        start = p.clock.start_run()
        p.runner.last_step = p.limit
        p.ledger.reset()
        with p.signals.installed(), quiet_float_errors():
            try:
                self._train()
                if state.val_step != p.pos.step:
                    self._validate()
                if p.world.main:  # the others have nothing to report
                    state.test_ppl = self._test()
                guard.check_results(p.history.val_ppl, self._rank0s(state.test_ppl))
                if state.early_stopped:
                    message = state.early_stopped
            except Stopped as exc:
                if exc.abandoned:
                    raise  # a second Ctrl-C: it said what is on disk; nothing more is written
                stop = exc
                status, message = "interrupted", f"interrupted at step {p.pos.step}"
                self._drain_losses()  # the bar shows the step the run stopped at
                self._show_progress()
                p.say(f"Interrupted at step {p.pos.step} ({exc}): saving checkpoint "
                      "and log block")
            except TrainingError as exc:
                status, message = "failed", str(exc)
            train_time = time.perf_counter() - start  # evaluation included
            p.clock.end_run(p.pos.step)
            with p.signals.deferring(FINAL):
                record, (status, message) = finish(p, state, self.save, status, message,
                                                   train_time)
        stop = guard.late_stop(p.signals.requested, stop)
        if stop is not None:
            stop.checkpoint = p.checkpoints.written  # where to resume from
            raise stop
        if status == "failed":
            raise TrainingError(message)
        return record

    def _train(self) -> None:
        p = self.parts
        cfg, nb, pos = p.cfg, p.steps_per_epoch, p.pos
        while pos.epoch < cfg.num_epochs and pos.step < p.limit and not self.state.early_stopped:
            # a resumed run continues the epoch clock where the checkpoint left it
            p.clock.start_epoch(pos.step, p.history.epoch_elapsed)
            p.history.epoch_elapsed = 0.0
            if p.progress:
                p.progress.start_epoch(pos.epoch, min(nb, pos.batch + p.limit - pos.step),
                                       pos.batch)
            while pos.batch < nb and pos.step < p.limit:
                self._step()
                if cfg.eval_interval and pos.step % cfg.eval_interval == 0:
                    self._validate()
                if p.comm is None or pos.step % cfg.log_interval == 0:
                    self._check_stop()
                if self.state.early_stopped:
                    break
            p.backend.synchronize()
            self._drain_losses()
            self._show_progress()  # the bar ends at its total
            if pos.batch < nb:
                break  # stopped by MAX_STEPS or early stopping mid-epoch
            p.epoch_times.append(p.clock.epoch_time(pos.step))
            pos.epoch, pos.batch = pos.epoch + 1, 0
            p.say(f"epoch {pos.epoch}/{cfg.num_epochs}: {p.epoch_times[-1]:.2f}s")
            if self.state.val_step != pos.step:
                self._validate()
            with p.signals.deferring(WRITES):
                self.save()
            self._check_stop()

    def _step(self) -> None:
        """One step, with stop signals deferred to its end; the losses are read back (and
        progress shown) once the ring is full."""
        p = self.parts
        with p.signals.deferring():
            p.runner.run(p.pos.step)
            p.pos.step += 1
            p.pos.batch += 1
        if p.pos.step - len(p.losses) == len(p.runner.ring):
            self._drain_losses()
            self._show_progress()

    def _show_progress(self) -> None:
        """The bar at the current step, with the latest loss (call after a loss drain)."""
        p = self.parts
        if p.progress and p.losses:
            p.progress.update(p.pos, p.losses[-1], p.clock.tokens_per_s(
                p.pos.step - self.state.start_step, p.tokens_per_step))

    def _check_stop(self) -> None:
        """Stop here if asked to. In a data-parallel run every process must stop at the same
        step, so the requests are summed over the processes first (here only every
        LOG_INTERVAL steps and at epoch ends, to keep the host off the device)."""
        p = self.parts
        if p.comm is not None:
            asked = p.backend.xp.asarray(float(p.signals.requested is not None),
                                         dtype=np.float32)
            p.comm.all_reduce(asked)
            if float(p.backend.to_host(asked)) == 0:
                # The decision is the sum, not this process's flag now: a signal landing
                # after the all-reduce waits for the next check, or the processes would
                # part (one saving, the other in the next step's collectives).
                return
            if p.signals.requested is None:
                p.signals.requested = signal.SIGTERM  # another process was asked
        p.signals.check()

    def _drain_losses(self) -> None:
        p = self.parts
        p.runner.drain(p.losses, p.pos.step, divergence_advice(p.cfg))
        with p.ledger.set_aside():  # a guard's reads, not the step's traffic
            guard.check_loss_scale(p.optimizer.loss_scaler, p.backend.to_host,
                                   p.pos.step, p.cfg.precision)

    def _validate(self) -> None:
        """Validation perplexity, into the curve; a new best writes the best checkpoint, and
        PATIENCE validations in a row without one stop the run. With weight averaging
        (EMA_DECAY, AVERAGE_LAST_K) the averaged weights are measured and saved."""
        p = self.parts
        self._whole_master()
        if p.averager is not None:
            with p.ledger.set_aside():
                p.averager.at_validation()
        with p.checkpoints.averaged():
            best, stop = p.history.validated(self.evaluate("valid"), p.cfg.patience)
            self.state.val_step = p.pos.step
            p.say(f"step {p.pos.step}: validation perplexity {p.history.val_ppl:.2f}"
                  f"{p.evaluator.on('valid')}")
            if best:
                # deferred: a best file and the history that names it agree
                with p.signals.deferring(WRITES), p.clock.timed("checkpoint"):
                    p.checkpoints.save_best()
        if stop:
            self.state.early_stopped = stop
            p.say(stop)

    def _whole_master(self) -> None:
        """The float32 master whole on every process, for what reads it between steps (a
        ZeRO-1 run's steps may gather only the compute copy: ShardedOptimizer). Every process
        calls it, at validation and at every save, so the best checkpoint, the checkpoint
        and the test (after the last validation) read whole weights."""
        if self.parts.sharded:
            self.parts.optimizer.gather_master()

    def _rank0s(self, value: float | None) -> float | None:
        """Rank 0's `value` on every process of a data-parallel run (an all-reduce of it and
        the others' zeros): the test perplexity, which rank 0 alone measures, then fails or
        passes every process alike, and none is left waiting in a collective that a failed
        rank 0 skips. `value` itself in one process."""
        p = self.parts
        if p.comm is None:
            return value
        mine = value if p.world.main and value is not None else 0.0
        shared = p.backend.xp.asarray(mine, dtype=np.float64)
        with p.ledger.set_aside():  # a guard's read, not the step's traffic
            p.comm.all_reduce(shared)
            return float(p.backend.to_host(shared))

    def _test(self) -> float:
        """Test perplexity of the best validated weights (the last ones if none were saved)."""
        with self.parts.checkpoints.best_weights(self.parts.pos.step) as which:
            self.state.test_ppl_of = which
            return self.evaluate("test")

    def evaluate(self, split: str) -> float:
        """Perplexity of a split (exp of the mean per-token NLL): all of it, or its first
        EVAL_TOKENS scored tokens."""
        with self.parts.clock.timed("eval"):
            hooks.pause("evaluation")
            return self.parts.evaluator(split)

    # ---- output ------------------------------------------------------------------------------
    def save(self) -> str | None:
        """Write the resumable checkpoint (see RunCheckpoints.save); where it went."""
        p = self.parts
        self._drain_losses()
        self._whole_master()
        p.history.epoch_elapsed = p.clock.epoch_clock() if p.pos.batch else 0.0
        with p.clock.timed("checkpoint"):
            saved = p.checkpoints.save()
        p.history.epoch_elapsed = 0.0
        return saved


def nothing_left(cfg: Config, step: int, total_steps: int) -> str:
    """What a resume of a finished run says (it trains nothing and logs nothing)."""
    done = (f"all {plural(cfg.num_epochs, 'epoch')}" if step >= total_steps
            else f"MAX_STEPS={cfg.max_steps}")
    return (f"Nothing left to do: the checkpoint is at step {step}, which completes {done}. "
            f"To train longer, resume with --num-epochs {cfg.num_epochs + 1} (or more), or a "
            "larger --max-steps.")


def divergence_advice(cfg: Config) -> str:
    """What to change when the loss turns non-finite (GRAD_CLIP only when it is off)."""
    advice = f"lower LEARNING_RATE (now {cfg.learning_rate:g})"
    return advice + (" or set GRAD_CLIP (e.g. 1.0)" if cfg.grad_clip <= 0 else "")


def train(cfg: Config, say: Say = print, resume: str | None = None, progress: Any = None,
          warn: Say | None = None, trace: str | None = None,
          overwrite: bool = False, init_from: str | None = None,
          allow_data_change: bool = False) -> RunRecord | None:
    """Train per `cfg`, as one process or as one of a data-parallel run's (the launcher's
    environment says which); returns the run record also appended to the log (None when a
    resumed run had nothing left to do, and on every process but rank 0). `trace`: see
    RunParts; `init_from`: a checkpoint whose weights the run starts from (init_from.py);
    `allow_data_change`: a resume may continue on other training data (resume.check_data)."""
    world = World.from_env()
    check_world(cfg, world)
    with process_group(world, cfg.comm_timeout) as group:
        trainer = Trainer(cfg, say, resume=resume, progress=progress, warn=warn, trace=trace,
                          group=group, world=world, overwrite=overwrite, init_from=init_from,
                          allow_data_change=allow_data_change)
        clean = False
        try:
            record = trainer.run()
            clean = True
            return record
        except Stopped:
            clean = True  # every process stopped at the same step
            raise
        finally:
            if trainer.comm is not None:
                trainer.runner.release_graph()
                trainer.comm.close(clean)


def warm_up(cfg: Config, say: Say = print) -> None:
    """Run the first (eager) step of `cfg`'s training on a throwaway copy of its model: the GPU
    kernels it needs are compiled into CuPy's disk cache, and a training run started next
    begins warm. Nothing is trained or written (no checkpoint, no log block). Silent where
    there is nothing to warm (the CPU, or a GPU run that would fall back to it: the training
    run says so itself)."""
    with tempfile.TemporaryDirectory(prefix="rustyflow-warmup-") as scratch:
        # its outputs point into a scratch folder: it claims (checks, locks) no run's files
        trainer = Trainer(dataclasses.replace(cfg, profile=False, model_path=f"{scratch}/w.npz",
                                              log_file=f"{scratch}/log.txt"),
                          silent, warn=silent)
        try:
            if trainer.backend.kind != "gpu":
                return
            trainer.runner.run(0)
        finally:
            if trainer.parts.lock is not None:
                trainer.parts.lock.release()
    up = trainer.runner.startup
    say(f"Warm-up: first step {up['first_step_s']:.2f}s (kernel cache {up['cache']}); the "
        "kernels are in CuPy's disk cache for the next run")


def check_world(cfg: Config, world: World) -> None:
    """NUM_GPUS asks for a launch; under a launcher already, it must agree with it."""
    if not world.distributed and cfg.num_gpus > 1:
        raise ConfigError(f"NUM_GPUS={cfg.num_gpus} needs one process per GPU: start it with "
                          f"`{command()} train --gpus {cfg.num_gpus}` (or mpiexec -n "
                          f"{cfg.num_gpus}, or srun)")
    if world.distributed and cfg.num_gpus not in (1, world.size):
        raise ConfigError(f"NUM_GPUS={cfg.num_gpus} but the launcher ({world.launcher}) "
                          f"started {world.size} processes: drop NUM_GPUS (the launcher's "
                          "process count decides) or make them agree")


