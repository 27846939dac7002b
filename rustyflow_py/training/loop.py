"""The training loop: a thin driver over the step runner, evaluation, checkpoints and the log.

The run's parts are built and checked before any work (run_parts.py), and its end is written
by finish.py. A stop request (Ctrl-C, SIGTERM, SIGUSR1) finishes the current step, then
writes a checkpoint and an "interrupted" log block, so `--resume` continues exactly.
"""

from __future__ import annotations

import dataclasses
import signal
import tempfile
import time
from typing import Any

import numpy as np

from ..distributed.group import process_group
from ..distributed.world import World
from ..errors import ConfigError, TrainingError, command
from ..reporting.record_schema import RunRecord
from ..reporting.text import plural
from . import guard, hooks
from .config import Config
from .finish import finish
from .run_parts import RunParts, Say, silent
from .signals import FINAL, WRITES, Stopped
from .step import quiet_float_errors


class Trainer(RunParts):
    """One training run of `cfg` on one device; `run()` returns the run record (the
    arguments: see RunParts). The loop: epochs of steps, validation, early stopping, stop
    requests, and the resumable checkpoint at each epoch end."""

    # ---- the run -----------------------------------------------------------------------------
    def run(self) -> RunRecord | None:
        """See _run; the checkpoint lock is released at the end, however the run ends."""
        try:
            return self._run()
        finally:
            if self.lock is not None:
                self.lock.release()

    def _run(self) -> RunRecord | None:
        """Train, evaluate, save, log. Returns the record (None if nothing was left to do, and
        on every data-parallel process but rank 0);
        raises Stopped after an interrupted run and TrainingError after a failed one, both
        once the checkpoint and the log block are written."""
        if self.pos.step >= self.limit:
            self.say(nothing_left(self.cfg, self.pos.step, self.total_steps))
            return None
        status, message, stop = "completed", None, None
        start = self.clock.start_run()
        self.runner.last_step = self.limit
        self.ledger.reset()
        with self.signals.installed(), quiet_float_errors():
            try:
                self._train()
                if self._val_step != self.pos.step:
                    self._validate()
                if self.world.main:  # the others have nothing to report
                    self.test_ppl = self._test()
                guard.check_results(self.val_ppl, self.test_ppl)
                if self.early_stopped:
                    message = self.early_stopped
            except Stopped as exc:
                if exc.abandoned:
                    raise  # a second Ctrl-C: it said what is on disk; nothing more is written
                stop = exc
                status, message = "interrupted", f"interrupted at step {self.pos.step}"
                self._drain_losses()  # the bar shows the step the run stopped at
                self._show_progress()
                self.say(f"Interrupted at step {self.pos.step} ({exc}): saving checkpoint "
                         "and log block")
            except TrainingError as exc:
                status, message = "failed", str(exc)
            train_time = time.perf_counter() - start  # evaluation included
            self.clock.end_run(self.pos.step)
            with self.signals.deferring(FINAL):
                record, (status, message) = finish(self, status, message, train_time)
        stop = guard.late_stop(self.signals.requested, stop)
        if stop is not None:
            stop.checkpoint = self.checkpoints.written  # where to resume from
            raise stop
        if status == "failed":
            raise TrainingError(message)
        return record

    def _train(self) -> None:
        cfg, nb, pos = self.cfg, self.steps_per_epoch, self.pos
        while pos.epoch < cfg.num_epochs and pos.step < self.limit and not self.early_stopped:
            # a resumed run continues the epoch clock where the checkpoint left it
            self.clock.start_epoch(pos.step, self.history.epoch_elapsed)
            self.history.epoch_elapsed = 0.0
            if self.progress:
                self.progress.start_epoch(pos.epoch, min(nb, pos.batch + self.limit - pos.step),
                                          pos.batch)
            while pos.batch < nb and pos.step < self.limit:
                self._step()
                if cfg.eval_interval and pos.step % cfg.eval_interval == 0:
                    self._validate()
                if self.comm is None or pos.step % cfg.log_interval == 0:
                    self._check_stop()
                if self.early_stopped:
                    break
            self.backend.synchronize()
            self._drain_losses()
            self._show_progress()  # the bar ends at its total
            if pos.batch < nb:
                break  # stopped by MAX_STEPS or early stopping mid-epoch
            self.epoch_times.append(self.clock.epoch_time(pos.step))
            pos.epoch, pos.batch = pos.epoch + 1, 0
            self.say(f"epoch {pos.epoch}/{cfg.num_epochs}: {self.epoch_times[-1]:.2f}s")
            if self._val_step != pos.step:
                self._validate()
            with self.signals.deferring(WRITES):
                self.save()
            self._check_stop()

    def _step(self) -> None:
        """One step, with stop signals deferred to its end; the losses are read back (and
        progress shown) once the ring is full."""
        with self.signals.deferring():
            self.runner.run(self.pos.step)
            self.pos.step += 1
            self.pos.batch += 1
        if self.pos.step - len(self.losses) == len(self.runner.ring):
            self._drain_losses()
            self._show_progress()

    def _show_progress(self) -> None:
        """The bar at the current step, with the latest loss (call after a loss drain)."""
        if self.progress and self.losses:
            self.progress.update(self.pos, self.losses[-1], self.clock.tokens_per_s(
                self.pos.step - self.start_step, self.tokens_per_step))

    def _check_stop(self) -> None:
        """Stop here if asked to. In a data-parallel run every process must stop at the same
        step, so the requests are summed over the processes first (here only every
        LOG_INTERVAL steps and at epoch ends, to keep the host off the device)."""
        if self.comm is not None:
            xp = self.backend.xp
            asked = xp.asarray(float(self.signals.requested is not None), dtype=np.float32)
            self.comm.all_reduce(asked)
            if float(self.backend.to_host(asked)) == 0:
                # The decision is the sum, not this process's flag now: a signal landing
                # after the all-reduce waits for the next check, or the processes would
                # part (one saving, the other in the next step's collectives).
                return
            if self.signals.requested is None:
                self.signals.requested = signal.SIGTERM  # another process was asked
        self.signals.check()

    def _drain_losses(self) -> None:
        self.runner.drain(self.losses, self.pos.step, divergence_advice(self.cfg))
        with self.ledger.set_aside():  # a guard's reads, not the step's traffic
            guard.check_loss_scale(self.optimizer.loss_scaler, self.backend.to_host,
                                   self.pos.step, self.cfg.precision)

    def _validate(self) -> None:
        """Validation perplexity, into the curve; a new best writes the best checkpoint, and
        PATIENCE validations in a row without one stop the run. With weight averaging
        (EMA_DECAY, AVERAGE_LAST_K) the averaged weights are measured and saved."""
        if self.averager is not None:
            with self.ledger.set_aside():
                self.averager.at_validation()
        with self.checkpoints.averaged():
            best, stop = self.history.validated(self.evaluate("valid"), self.cfg.patience)
            self._val_step = self.pos.step
            self.say(f"step {self.pos.step}: validation perplexity {self.val_ppl:.2f}"
                     f"{self.evaluator.on('valid')}")
            if best:
                # deferred: a best file and the history that names it agree
                with self.signals.deferring(WRITES), self.clock.timed("checkpoint"):
                    self.checkpoints.save_best()
        if stop:
            self.early_stopped = stop
            self.say(stop)

    def _test(self) -> float:
        """Test perplexity of the best validated weights (the last ones if none were saved)."""
        with self.checkpoints.best_weights(self.pos.step) as which:
            self.test_ppl_of = which
            return self.evaluate("test")

    def evaluate(self, split: str) -> float:
        """Perplexity of a split (exp of the mean per-token NLL): all of it, or its first
        EVAL_TOKENS scored tokens."""
        with self.clock.timed("eval"):
            hooks.pause("evaluation")
            return self.evaluator(split)

    # ---- output ------------------------------------------------------------------------------
    def save(self) -> str | None:
        """Write the resumable checkpoint (see RunCheckpoints.save); where it went."""
        self._drain_losses()
        self.history.epoch_elapsed = self.clock.epoch_clock() if self.pos.batch else 0.0
        with self.clock.timed("checkpoint"):
            saved = self.checkpoints.save()
        self.history.epoch_elapsed = 0.0
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
    Trainer; `init_from`: a checkpoint whose weights the run starts from (init_from.py);
    `allow_data_change`: a resume may continue on other training data (resume.check_data)."""
    world = World.from_env()
    check_world(cfg, world)
    with process_group(world, cfg.comm_timeout) as group:
        trainer = Trainer(cfg, say, resume, progress, warn, trace, group, world, overwrite,
                          init_from, allow_data_change)
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
            if trainer.lock is not None:
                trainer.lock.release()
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


