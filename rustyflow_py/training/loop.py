"""The training loop: a thin driver over the step runner, evaluation, checkpoints and the log.

Everything that can make a run fail at its end is checked at its start: the output paths can
be written, every split fits the batch layout, a resume checkpoint matches. A stop request
(Ctrl-C, SIGTERM, SIGUSR1) finishes the current step, then writes a checkpoint and an
"interrupted" log block, so `--resume` continues exactly.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import data
from ..distributed.comm import communicator
from ..distributed.data_parallel import BucketedAllReduce, ReduceScatter, ShardedOptimizer
from ..distributed.group import check_same_config, process_group, rank_device
from ..distributed.world import World
from ..engine.backend import get_backend, resolve_device
from ..engine.precision import GPU_ONLY, Precision
from ..engine.profiler import Profiler
from ..errors import ConfigError, TrainingError
from ..model.gpt import build_model
from ..model.loss_scale import LossScaler
from ..reporting import logfile, report
from ..reporting.trace import MAX_STEPS as TRACE_STEPS
from ..reporting.trace import chrome_trace, graph_trace
from . import guard, hooks, outputs, sizing
from .averaging import averager_for
from .clock import RunClock
from .config import Config
from .evaluate import SplitEvaluator, upload_split
from .graph_profile import GraphSampler, choose_mode
from .init_from import initialize
from .init_from import load as load_init
from .optimizers import make_optimizer
from .record import TransferLedger, build_record
from .resume import History, restore
from .saver import RunCheckpoints
from .signals import Stopped, StopSignals
from .step import Shards, StepRunner, quiet_float_errors, use_graph
from .subword.corpus import corpus_for_run

Say = Callable[[str], None]


class Trainer:
    """One training run of `cfg` on one device; `run()` returns the run record.

    `say` gets progress and results, `warn` gets warnings (default: `say`; the command line
    sends them to stderr). `trace` is a file to write the first profiled steps to as a
    Chrome/Perfetto trace at the end of the run (an output of this run, like the log block,
    not a setting: it is no config key and no part of the checkpoint).
    """

    @guard.releases_on_failure
    def __init__(self, cfg: Config, say: Say = print, resume: str | None = None,
                 progress: Any = None, warn: Say | None = None,
                 trace: str | None = None, group: Any = None,
                 world: World | None = None, overwrite: bool = False,
                 init_from: str | None = None) -> None:
        self.world = world = world or World()
        main = world.main  # only rank 0 talks, logs and writes checkpoints
        self.cfg, self.say = cfg, say if main else _silent
        self.progress = progress if main else None
        self.warn, self.trace = warn or say, trace if main else None
        if main:
            outputs.check_log_file(cfg.log_file)
        if self.trace:
            check_trace(self.trace, cfg)
        if group is not None:
            check_same_config(group, world, cfg.to_dict())
        self.device, self.fallback = resolve_device(
            rank_device(cfg.device, world), cfg.strict_device or world.distributed, self.say,
            self.warn)
        # held until run() ends (or this object goes): see lock.py
        self.lock = (guard.claim_outputs(cfg.model_path_for(self.device), cfg.log_file,
                                         self.trace, resume, overwrite, self.say, self.warn,
                                         recipe=cfg.to_dict())
                     if main else None)
        self.backend = get_backend(self.device)
        self.backend.configure(cfg.threads, cfg.cpu_jit, self.say, self.warn)
        self.precision = Precision.of(cfg.precision)
        check_precision(cfg.precision, self.backend.kind, self.fallback)
        self.backend.set_precision(self.precision)
        self.backend.kernels.set_attention(cfg.attention)
        self.comm = communicator(self.backend, group) if group is not None else None
        sharded = cfg.shard_optimizer and self.comm is not None
        if cfg.shard_optimizer and not sharded:
            self.warn("WARN: SHARD_OPTIMIZER=true in a single process: nothing to shard")
        self.corpus = corpus_for_run(cfg, self.warn, resume)
        if self.corpus.tokenizer is not None:
            self.say(f"Tokenizer: {self.corpus.tokenizer.describe()}")
        streams = cfg.batch_size * cfg.grad_accum_steps * world.size  # a step's global batch
        data.check_layout(self.corpus, streams, cfg.seq_len)
        sizing.check_fits(cfg, len(self.corpus.vocab), self.backend,
                          world_size=world.size if sharded else 1)
        self.model = build_model(cfg, len(self.corpus.vocab), self.device,
                                 self.precision.storage, world.size if sharded else 1,
                                 compute=self.precision.compute)
        if init_from:
            initialize(load_init(init_from), self.model.buffer, cfg.seq_len,
                       self.corpus.vocab.itos, f"{cfg.dataset}'s words", self.say)
        self.train_stream = upload_split(self.backend, self.corpus.train, streams)
        self.steps_per_epoch = data.num_batches(self.train_stream, cfg.seq_len)
        self.total_steps = cfg.num_epochs * self.steps_per_epoch
        buffer = self.model.buffer
        sync: Any = None
        if sharded:
            self.optimizer: Any = ShardedOptimizer(
                buffer, self.comm, lambda shard: make_optimizer(cfg, shard, self.total_steps))
            sync = ReduceScatter(buffer, self.comm)
        else:
            self.optimizer = make_optimizer(cfg, buffer, self.total_steps)
            if self.comm is not None:
                sync = BucketedAllReduce(buffer, self.comm, int(cfg.bucket_mb * 2**20))
        if self.precision.loss_scaling:
            self.optimizer.loss_scaler = LossScaler(self.backend.xp)
        self.shards = Shards(world.rank, world.size, cfg.grad_accum_steps, self.comm, sync)
        self.averager = averager_for(cfg, buffer)  # EMA_DECAY / AVERAGE_LAST_K, or None
        self.history = (restore(resume, cfg, self.corpus.vocab.itos, buffer, self.optimizer,
                                self.warn, world.size, self.averager)
                        if resume else History())
        if resume:
            self.say(f"Resumed from {resume} at step {self.pos.step} (epoch "
                     f"{self.pos.epoch + 1}, batch {self.pos.batch})")
        self.test_ppl: float | None = None
        self.test_ppl_of: str | None = None  # which weights test_ppl measured
        self.early_stopped = ""  # why the run stopped early, once it has
        self._val_step = -1  # the step at which val_ppl was measured
        self.start_step = self.pos.step  # this process's steps are counted from here
        self.profiler = (Profiler(self.backend, TRACE_STEPS if self.trace else 0)
                         if cfg.profile else None)
        graph = use_graph(cfg.graph, self.backend.kind, self.warn)
        self.profile_mode, tracer = (
            choose_mode(cfg.profile_mode, self.backend.kind, graph, self.warn, world.size)
            if cfg.profile else ("off", None))
        sampler = (GraphSampler(self.profiler, tracer, cfg.profile_steps,
                                busy=lambda: not self.backend.stream.done)
                   if tracer is not None and self.profiler is not None else None)
        self.runner = StepRunner(
            self.model, self.optimizer, self.train_stream, cfg.seq_len,
            log_interval=min(cfg.log_interval, self.limit),  # a ring no longer than the run
            profiler=self.profiler,
            profile_steps=cfg.profile_steps, graph=graph, warn=self.warn,
            shards=self.shards, sampler=sampler, averager=self.averager)
        self.ledger = TransferLedger(self.backend)
        self.checkpoints = RunCheckpoints(
            cfg.model_path_for(self.device), cfg, self.device, self.model, self.optimizer,
            self.corpus.vocab.to_array(), self.history, self.ledger.set_aside, self.warn,
            world.size, writes=main, barrier=self.comm.barrier if self.comm else None,
            tokenizer=self.corpus.tokenizer, averager=self.averager)
        self.evaluator = SplitEvaluator(self.model, self.corpus, cfg.batch_size, cfg.seq_len,
                                        cfg.eval_stride, self.progress, self.ledger.set_aside,
                                        cfg.eval_tokens)
        self.signals = StopSignals(self.say)
        # Processes must stop at the same step: a stop request waits for the next agreement
        # (see _check_stop) instead of interrupting evaluation on one process only.
        self.signals.deferred = world.distributed
        self.clock = RunClock(self.runner, self.backend.synchronize, self.pos.step)
        self._in_step = False  # a stop forced inside a step must not overwrite the checkpoint

    # The history's parts, as the loop and the record read them.
    pos = property(lambda self: self.history.pos)
    losses = property(lambda self: self.history.losses)
    epoch_times = property(lambda self: self.history.epoch_times)
    val_ppl = property(lambda self: self.history.val_ppl)
    checkpoint_path = property(lambda self: self.checkpoints.path)
    best_path = property(lambda self: self.checkpoints.best_file)

    @property
    def limit(self) -> int:
        """The step the run stops at (MAX_STEPS, or the end of the last epoch)."""
        return min(self.cfg.max_steps or self.total_steps, self.total_steps)

    # ---- the run -----------------------------------------------------------------------------
    def run(self) -> report.RunRecord | None:
        """See _run; the checkpoint lock is released at the end, however the run ends."""
        try:
            return self._run()
        finally:
            if self.lock is not None:
                self.lock.release()

    def _run(self) -> report.RunRecord | None:
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
                stop = exc
                status, message = "interrupted", f"interrupted at step {self.pos.step}"
                if not self._in_step:  # the bar shows the step the run stopped at
                    self._drain_losses()
                    self._show_progress()
                self.say(f"Interrupted at step {self.pos.step} ({exc}): saving checkpoint "
                         "and log block")
            except TrainingError as exc:
                status, message = "failed", str(exc)
            train_time = time.perf_counter() - start  # evaluation included
            self.clock.end_run()
            with self.signals.deferring():
                record = self._finish(status, message, train_time)
            status, message = self.outcome
        stop = guard.late_stop(self.signals.requested, stop)
        if stop is not None:
            raise stop
        if status == "failed":
            raise TrainingError(message)
        return record

    def _finish(self, status: str, message: str | None,
                train_time: float) -> report.RunRecord | None:
        """Checkpoint (not after a divergence), record, console summary, log block (rank 0;
        the others only take part in gathering a sharded optimizer's state)."""
        ckpt = None
        if status == "interrupted" and self._in_step:
            message = (f"{message} (inside a step: the checkpoint was not written, the last "
                       "one stays)")
        elif status != "failed":
            ckpt = self.save()
        status, message = self.outcome = guard.final_status(
            status, message, self.checkpoints.lost, self.signals.requested)
        if not self.world.main:
            return None
        record = build_record(self, status, message, train_time, ckpt)
        block = report.format_block(record)
        def append(path: str) -> None:
            hooks.pause("log-append")
            logfile.append_block(path, block)

        log = outputs.write_with_fallback(self.cfg.log_file, append, "log block", self.warn,
                                          name="training_log.txt")
        self.say(report.format_summary(record, log))
        if log is None:
            self.outcome = "failed", f"the log block of this {status} run is lost (see above)"
        elif self.signals.requested is not None and status != "interrupted":
            # the block was written as the run ended; the exit status will report the signal
            self.say(f"A stop request arrived while the log block was written: the run had "
                     f"ended {status} (as logged); exiting with the signal's status")
        if self.trace and self.profiler is not None:
            write_trace(self.trace, self.profiler, self.backend, self.device, self.say,
                        self.warn)
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
            with self.signals.deferring():
                self.save()
            self._check_stop()

    def _step(self) -> None:
        """One step, with stop signals deferred to its end; the losses are read back (and
        progress shown) once the ring is full."""
        with self.signals.deferring():
            self._in_step = True
            self.runner.run(self.pos.step)
            self.pos.step += 1
            self.pos.batch += 1
            self._in_step = False
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
                with self.signals.deferring(), self.clock.timed("checkpoint"):
                    self.checkpoints.save_best()
        if stop:
            self.early_stopped = stop
            self.say(stop)

    def _test(self) -> float:
        """Test perplexity of the best validated weights (the last ones if none were saved)."""
        with self.checkpoints.best_weights(self.pos.step) as which:
            self.test_ppl_of = which
            return self.evaluate("test")

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over all processes."""
        return self.cfg.batch_size * self.shards.count * self.cfg.seq_len

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


def check_trace(path: str, cfg: Config) -> None:
    """--trace needs the profiler and a writable file."""
    if not cfg.profile:
        raise TrainingError("--trace needs the profiler, which PROFILE=false turns off: drop "
                            "--no-profile (or PROFILE=false) to trace")
    outputs.check_file_target(path, "trace file", "pass --trace a writable file path")


def nothing_left(cfg: Config, step: int, total_steps: int) -> str:
    """What a resume of a finished run says (it trains nothing and logs nothing)."""
    done = (f"all {report.plural(cfg.num_epochs, 'epoch')}" if step >= total_steps
            else f"MAX_STEPS={cfg.max_steps}")
    return (f"Nothing left to do: the checkpoint is at step {step}, which completes {done}. "
            f"To train longer, resume with --num-epochs {cfg.num_epochs + 1} (or more), or a "
            "larger --max-steps.")


def divergence_advice(cfg: Config) -> str:
    """What to change when the loss turns non-finite (GRAD_CLIP only when it is off)."""
    advice = f"lower LEARNING_RATE (now {cfg.learning_rate:g})"
    return advice + (" or set GRAD_CLIP (e.g. 1.0)" if cfg.grad_clip <= 0 else "")


def write_trace(path: str, prof: Profiler, backend: Any, device: str, say: Say,
                warn: Say) -> None:
    """The profiled steps' timeline as a Chrome trace (also after an interrupted run): a
    graph profile's first sampled replay, else the first profiled steps."""
    if prof.graph is not None and prof.graph.first:
        doc = graph_trace(prof.graph.first, prof.graph.first_step, device=device,
                          hardware=backend.hardware(), replays=prof.graph.replays)
    else:
        doc = chrome_trace(prof.spans, prof.step_numbers, gpu=backend.kind == "gpu",
                           device=device, hardware=backend.hardware(),
                           profiled_steps=prof.steps)
    data = json.dumps(doc, separators=(",", ":")).encode()
    where = outputs.write_with_fallback(
        str(path), lambda p: outputs.write_atomically(p, lambda f: f.write(data)), "trace", warn)
    if where:
        traced = 1 if prof.graph is not None and prof.graph.first else len(prof.step_numbers)
        say(f"Trace of {traced} profiled step{'s' if traced != 1 else ''}: {where} (open it in "
            "ui.perfetto.dev or chrome://tracing)")


def _silent(_message: str) -> None:
    """What a data-parallel process other than rank 0 says: nothing (rank 0 speaks)."""


def train(cfg: Config, say: Say = print, resume: str | None = None, progress: Any = None,
          warn: Say | None = None, trace: str | None = None,
          overwrite: bool = False, init_from: str | None = None) -> report.RunRecord | None:
    """Train per `cfg`, as one process or as one of a data-parallel run's (the launcher's
    environment says which); returns the run record also appended to the log (None when a
    resumed run had nothing left to do, and on every process but rank 0). `trace`: see
    Trainer; `init_from`: a checkpoint whose weights the run starts from (init_from.py)."""
    world = World.from_env()
    check_world(cfg, world)
    with process_group(world, cfg.comm_timeout) as group:
        trainer = Trainer(cfg, say, resume, progress, warn, trace, group, world, overwrite,
                          init_from)
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
                          _silent, warn=_silent)
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
                          f"`rustyflow train --gpus {cfg.num_gpus}` (or mpiexec -n "
                          f"{cfg.num_gpus}, or srun)")
    if world.distributed and cfg.num_gpus not in (1, world.size):
        raise ConfigError(f"NUM_GPUS={cfg.num_gpus} but the launcher ({world.launcher}) "
                          f"started {world.size} processes: drop NUM_GPUS (the launcher's "
                          "process count decides) or make them agree")


def check_precision(precision: str, kind: str, fallback: str | None) -> None:
    """Mixed precision is for the GPU; on the CPU (asked for, or fallen back to) say so."""
    if precision in GPU_ONLY and kind != "gpu":
        why = f" (the GPU is unusable: {fallback})" if fallback else ""
        raise ConfigError(f"PRECISION={precision} is GPU-only (mixed precision){why}: train "
                          f"with DEVICE=gpu, or use PRECISION=fp32 on the CPU")
