"""A training run's parts, built from its config before any step runs.

Everything that can make a run fail at its end is checked here, at its start: the output paths
can be written, every split fits the batch layout, the model fits the device, a resume
checkpoint matches. What is built (device, model, optimizer, data-parallel sync, step runner,
checkpoints, evaluator, signals, clock) is what the loop (`loop.Trainer`) drives and what the
run record (`record.build_record`) reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import data
from ..data.fingerprint import fingerprint
from ..distributed.comm import communicator
from ..distributed.data_parallel import BucketedAllReduce, ReduceScatter, ShardedOptimizer
from ..distributed.group import check_same_config, rank_device
from ..distributed.world import World
from ..engine.backend import parse_device, resolve_device
from ..engine.precision import GPU_ONLY
from ..engine.profiler import Profiler
from ..errors import ConfigError, TrainingError
from ..model.gpt import build_model
from ..model.loss_scale import LossScaler
from ..reporting.trace import MAX_STEPS as TRACE_STEPS
from . import guard, outputs, sizing
from .averaging import averager_for
from .clock import RunClock
from .config import Config
from .evaluate import SplitEvaluator, upload_split
from .graph_profile import GraphSampler, choose_mode, shared_mode
from .init_from import initialize
from .init_from import load as load_init
from .optimizers import make_optimizer
from .policy import run_backend, run_policy
from .record import TransferLedger
from .resume import History, restore
from .saver import RunCheckpoints
from .signals import StopSignals
from .step import Shards, StepRunner, use_graph
from .subword.corpus import corpus_for_run

Say = Callable[[str], None]


class RunParts:
    """The parts of one training run of `cfg` on one device, and the run's state as the loop
    and the run record read it.

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
                 init_from: str | None = None, allow_data_change: bool = False) -> None:
        self.world = world = world or World()
        main = world.main  # only rank 0 talks, logs and writes checkpoints
        self.cfg, self.say = cfg, say if main else silent
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
        checkpoint = cfg.model_path_for(self.device, resume)
        claim = (guard.claim_outputs(checkpoint, cfg.log_file, self.trace, resume, overwrite,
                                     self.say, self.warn, recipe=cfg.to_dict(),
                                     device=self.device, fallback=self.fallback)
                 if main else None)
        self.lock = claim.lock if claim else None  # held until run() ends: see lock.py
        check_precision(cfg.precision, parse_device(self.device)[0], self.fallback)
        # the run's settings, frozen: its backend's kernels read them, nothing sets them
        self.backend = run_backend(self.device, run_policy(cfg), self.say, self.warn)
        self.precision = self.backend.policy.precision
        self.comm = communicator(self.backend, group) if group is not None else None
        sharded = cfg.shard_optimizer and self.comm is not None
        if cfg.shard_optimizer and not sharded:
            self.warn("WARN: SHARD_OPTIMIZER=true in a single process: nothing to shard")
        self.corpus = corpus_for_run(cfg, self.warn, resume)
        self.data = fingerprint(self.corpus.train)  # what the checkpoints say it trained on
        if self.corpus.tokenizer is not None:
            self.say(f"Tokenizer: {self.corpus.tokenizer.describe()}")
        streams = cfg.batch_size * cfg.grad_accum_steps * world.size  # a step's global batch
        data.check_trainable(self.corpus, cfg, world.size)
        sizing.check_fits(cfg, len(self.corpus.vocab), self.backend,
                          world_size=world.size if sharded else 1)
        self.model = build_model(cfg, len(self.corpus.vocab), self.backend,
                                 self.precision.storage, world.size if sharded else 1,
                                 compute=self.precision.compute)
        if init_from:
            initialize(load_init(init_from), self.model.buffer, cfg.seq_len,
                       self.corpus.vocab.itos, f"{cfg.dataset}'s words", self.say)
        self.train_stream = upload_split(self.backend, self.corpus.train, streams)
        self.steps_per_epoch = data.num_batches(self.train_stream, cfg.seq_len,
                                                shifted=cfg.random_offsets)
        self.total_steps = cfg.num_epochs * self.steps_per_epoch
        if cfg.warmup_steps >= self.total_steps:
            self.warn(f"WARN: WARMUP_STEPS={cfg.warmup_steps} is not shorter than the "
                      f"schedule's {self.total_steps} steps (NUM_EPOCHS={cfg.num_epochs} x "
                      f"{self.steps_per_epoch}): the learning rate never reaches "
                      f"LEARNING_RATE={cfg.learning_rate:g}; set WARMUP_STEPS below "
                      f"{self.total_steps}")
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
                                self.warn, world.size, self.averager, self.data,
                                allow_data_change)
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
        graph = use_graph(self.backend.policy.graph, self.backend.kind, self.warn)
        choice = (choose_mode(cfg.profile_mode, self.backend.kind, graph, self.warn)
                  if cfg.profile else ("off", None, None))
        if cfg.profile and self.comm is not None:
            choice = shared_mode(choice, lambda mine: group.allreduce(int(mine)) == world.size,
                                 self.warn)
        self.profile_mode, tracer, self.profile_fallback = choice
        # data parallel: every rank samples the replays rank 0 picks (graph_profile.py)
        agree = ((lambda want: group.bcast(want, root=0)) if self.comm is not None else None)
        sampler = (GraphSampler(self.profiler, tracer, cfg.profile_steps,
                                busy=lambda: not self.backend.stream.done, agree=agree)
                   if tracer is not None and self.profiler is not None else None)
        self.runner = StepRunner(
            self.model, self.optimizer, self.train_stream, cfg.seq_len,
            log_interval=min(cfg.log_interval, self.limit),  # a ring no longer than the run
            profiler=self.profiler,
            profile_steps=cfg.profile_steps, graph=graph, warn=self.warn,
            shards=self.shards, sampler=sampler, averager=self.averager,
            shift=cfg.seed if cfg.random_offsets else None)
        self.ledger = TransferLedger(self.backend)
        self.checkpoints = RunCheckpoints(
            checkpoint, cfg, self.device, self.model, self.optimizer,
            self.corpus.vocab.to_array(), self.history, self.ledger.set_aside, self.warn,
            world.size, writes=main, barrier=self.comm.barrier if self.comm else None,
            tokenizer=self.corpus.tokenizer, averager=self.averager,
            replacing=claim.replacing if claim else None, data=self.data)
        self.evaluator = SplitEvaluator(self.model, self.corpus, cfg.batch_size, cfg.seq_len,
                                        cfg.eval_stride, self.progress, self.ledger.set_aside,
                                        cfg.eval_tokens)
        self.signals = StopSignals(self.say, self.checkpoints.on_disk)
        # Processes must stop at the same step: a stop request waits for the next agreement
        # (see Trainer._check_stop) instead of interrupting evaluation on one process only.
        self.signals.deferred = world.distributed
        self.clock = RunClock(self.runner, self.backend.synchronize, self.pos.step)

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

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over all processes."""
        return self.cfg.batch_size * self.shards.count * self.cfg.seq_len


def check_trace(path: str, cfg: Config) -> None:
    """--trace needs the profiler and a writable file."""
    if not cfg.profile:
        raise TrainingError("--trace needs the profiler, which PROFILE=false turns off: drop "
                            "--no-profile (or PROFILE=false) to trace")
    outputs.check_file_target(path, "trace file", "pass --trace a writable file path")


def check_precision(precision: str, kind: str, fallback: str | None) -> None:
    """Mixed precision is for the GPU; on the CPU (asked for, or fallen back to) say so."""
    if precision in GPU_ONLY and kind != "gpu":
        why = f" (the GPU is unusable: {fallback})" if fallback else ""
        raise ConfigError(f"PRECISION={precision} is GPU-only (mixed precision){why}: train "
                          f"with DEVICE=gpu, or use PRECISION=fp32 on the CPU")


def silent(_message: str) -> None:
    """What a data-parallel process other than rank 0 says: nothing (rank 0 speaks)."""

