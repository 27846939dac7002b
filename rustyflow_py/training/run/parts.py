"""A training run's parts, built from its config before any step runs.

Everything that can make a run fail at its end is checked here, at its start: the output paths
can be written, every split fits the batch layout, the model fits the device, a resume
checkpoint matches. What is built (device, model, optimizer, data-parallel sync, step runner,
checkpoints, evaluator, signals, clock) is what the loop (`loop.Trainer`) drives and what the
run record (`record.build_record`) reads. Each builder runs at the point its checks must run:
the cheap ones first, nothing heavy before the outputs are claimed, the model only once the
data is known to fit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import data
from ...data.fingerprint import fingerprint
from ...distributed.comm import communicator
from ...distributed.data_parallel import BucketedAllReduce, ReduceScatter, ShardedOptimizer
from ...distributed.group import check_same_config, rank_device
from ...distributed.world import World
from ...engine.backend import parse_device, resolve_device
from ...engine.precision import GPU_ONLY, bfloat16
from ...engine.profiler import Profiler
from ...errors import ConfigError, TrainingError
from ...model.gpt import build_model
from ...model.loss_scale import LossScaler
from ...reporting.trace import MAX_STEPS as TRACE_STEPS
from ..config.config import Config
from ..config.optimizers import make_optimizer
from ..config.policy import run_backend, run_policy
from ..evaluation.averaging import averager_for
from ..evaluation.evaluate import SplitEvaluator, upload_split
from ..outputs import guard, writing
from ..outputs.saver import RunCheckpoints
from ..start import sizing
from ..start.init_from import initialize
from ..start.init_from import load as load_init
from ..start.resume import History, restore
from ..subword.corpus import corpus_for_run
from .clock import RunClock
from .graph_profile import GraphSampler, choose_mode, shared_mode
from .ledger import TransferLedger
from .signals import StopSignals
from .step import Shards, StepRunner, use_graph

Say = Callable[[str], None]


class RunParts:
    """The parts of one training run of `cfg` on one device, and the history its checkpoints
    keep.

    `say` gets progress and results, `warn` gets warnings (default: `say`; the command line
    sends them to stderr). `resume`: a checkpoint to continue; `overwrite`: another run's
    outputs may be replaced; `init_from`: a checkpoint whose weights the run starts from;
    `allow_data_change`: a resume may continue on other training data. `trace` is a file to
    write the first profiled steps to as a Chrome/Perfetto trace at the end of the run (an
    output of this run, like the log block, not a setting: it is no config key and no part of
    the checkpoint). `group` and `world`: the data-parallel process group and this process's
    place in it. The lock on the claimed outputs is released if any builder fails.
    """

    @guard.releases_on_failure
    def __init__(self, cfg: Config, say: Say = print, resume: str | None = None,
                 progress: Any = None, warn: Say | None = None,
                 trace: str | None = None, group: Any = None,
                 world: World | None = None, overwrite: bool = False,
                 init_from: str | None = None, allow_data_change: bool = False) -> None:
        self.world = world or World()
        main = self.world.main  # only rank 0 talks, logs and writes checkpoints
        self.cfg, self.say = cfg, say if main else silent
        self.progress = progress if main else None
        self.warn, self.trace = warn or say, trace if main else None
        self._resolve_device(group)
        checkpoint, claim = self._claim_outputs(resume, overwrite)
        self._build_backend(group)
        self._read_data(resume)
        self._build_model(init_from)
        self._build_optimizer()
        self.history = (restore(resume, cfg, self.corpus.vocab.itos, self.model.buffer,
                                self.optimizer, self.warn, self.world.size, self.averager,
                                self.data, allow_data_change)
                        if resume else History())  # after the optimizer: it restores its state
        if resume:
            self.say(f"Resumed from {resume} at step {self.pos.step} (epoch "
                     f"{self.pos.epoch + 1}, batch {self.pos.batch})")
        self._build_step_runner(group)
        self._build_outputs(checkpoint, claim)

    def _resolve_device(self, group: Any) -> None:
        """The cheap checks first (the log and trace files, every process's config), then the
        device: a run that could not write its log block fails before a GPU is touched."""
        cfg = self.cfg
        if self.world.main:
            writing.check_log_file(cfg.log_file)
        if self.trace:
            check_trace(self.trace, cfg)
        if group is not None:
            check_same_config(group, self.world, cfg.to_dict())
        self.device, self.fallback = resolve_device(
            rank_device(cfg.device, self.world), cfg.strict_device or self.world.distributed,
            self.say, self.warn)

    def _claim_outputs(self, resume: str | None,
                       overwrite: bool) -> tuple[str, guard.Claim | None]:
        """Claim the outputs (checked and locked) as soon as the device names the checkpoint,
        before any data is read: from here on a failure releases the lock. Returns the
        checkpoint path and the claim (None on every process but rank 0)."""
        cfg = self.cfg
        checkpoint = cfg.model_path_for(self.device, resume)
        claim = (guard.claim_outputs(checkpoint, cfg.log_file, self.trace, resume, overwrite,
                                     self.say, self.warn, recipe=cfg.to_dict(),
                                     device=self.device, fallback=self.fallback)
                 if self.world.main else None)
        self.lock = claim.lock if claim else None  # held until run() ends: see lock.py
        return checkpoint, claim

    def _build_backend(self, group: Any) -> None:
        """The run's settings, frozen into its backend (its kernels read them, nothing sets
        them), before any array exists: every array of the run is made on it. Then the
        communicator of a data-parallel run."""
        cfg = self.cfg
        check_precision(cfg.precision, parse_device(self.device)[0], self.fallback)
        self.backend = run_backend(self.device, run_policy(cfg), self.say, self.warn)
        self.precision = self.backend.policy.precision
        self.comm = communicator(self.backend, group) if group is not None else None
        if cfg.shard_optimizer and not self.sharded:
            self.warn("WARN: SHARD_OPTIMIZER=true in a single process: nothing to shard")
        self.reduce_dtype = reduce_dtype(cfg.grad_reduce_dtype, self.backend.kind,
                                         self.fallback, self.comm is not None, self.warn)

    def _read_data(self, resume: str | None) -> None:
        """The corpus, held to the batch layout and the model's size to the device's memory
        before the model is built: an input that cannot train allocates nothing."""
        cfg = self.cfg
        self.corpus = corpus_for_run(cfg, self.warn, resume)
        self.data = fingerprint(self.corpus.train)  # what the checkpoints say it trained on
        if self.corpus.tokenizer is not None:
            self.say(f"Tokenizer: {self.corpus.tokenizer.describe()}")
        data.check_trainable(self.corpus, cfg, self.world.size)
        sizing.check_fits(cfg, len(self.corpus.vocab), self.backend,
                          world_size=self.world.size if self.sharded else 1)

    def _build_model(self, init_from: str | None) -> None:
        """The model (its weights from --init-from's checkpoint, if given), then the training
        split on the device beside it and the schedule's length, which the optimizer needs."""
        cfg, size = self.cfg, self.world.size
        self.model = build_model(cfg, len(self.corpus.vocab), self.backend,
                                 self.precision.storage, size if self.sharded else 1,
                                 compute=self.precision.compute)
        if init_from:
            initialize(load_init(init_from), self.model.buffer, cfg.seq_len,
                       self.corpus.vocab.itos, f"{cfg.dataset}'s words", self.say)
        streams = cfg.batch_size * cfg.grad_accum_steps * size  # a step's global batch
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

    def _build_optimizer(self) -> None:
        """The optimizer over the model's flat buffer (each process's shard of it under
        SHARD_OPTIMIZER), the gradient sync between processes, loss scaling and weight
        averaging: all that a resume restores state into."""
        cfg, buffer = self.cfg, self.model.buffer
        self.averager = averager_for(cfg, buffer)  # EMA_DECAY / AVERAGE_LAST_K, or None
        sync: Any = None
        if self.sharded:
            self.optimizer: Any = ShardedOptimizer(
                buffer, self.comm, lambda shard: make_optimizer(cfg, shard, self.total_steps),
                gather_compute=self.averager is None)
            sync = ReduceScatter(buffer, self.comm, self.reduce_dtype)
            sync.hand_to(self.optimizer)
        else:
            self.optimizer = make_optimizer(cfg, buffer, self.total_steps)
            if self.comm is not None:
                sync = BucketedAllReduce(buffer, self.comm, int(cfg.bucket_mb * 2**20),
                                         self.reduce_dtype)
                sync.hand_to(self.optimizer)
        if self.precision.loss_scaling:
            self.optimizer.loss_scaler = LossScaler(self.backend.xp)
        self.shards = Shards(self.world.rank, self.world.size, cfg.grad_accum_steps,
                             self.comm, sync)

    def _build_step_runner(self, group: Any) -> None:
        """The profiler and the step runner, once the resume says where the run starts: the
        profile mode is agreed over the processes, and the losses' ring is no longer than
        the run."""
        cfg, backend = self.cfg, self.backend
        self.profiler = (Profiler(backend, TRACE_STEPS if self.trace else 0)
                         if cfg.profile else None)
        graph = use_graph(backend.policy.graph, backend.kind, self.warn)
        choice = (choose_mode(cfg.profile_mode, backend.kind, graph, self.warn)
                  if cfg.profile else ("off", None, None))
        if cfg.profile and self.comm is not None:
            size = self.world.size
            choice = shared_mode(choice, lambda mine: group.allreduce(int(mine)) == size,
                                 self.warn)
        self.profile_mode, tracer, self.profile_fallback = choice
        # data parallel: every rank samples the replays rank 0 picks (graph_profile.py)
        agree = ((lambda want: group.bcast(want, root=0)) if self.comm is not None else None)
        sampler = (GraphSampler(self.profiler, tracer, cfg.profile_steps,
                                busy=lambda: not backend.stream.done, agree=agree)
                   if tracer is not None and self.profiler is not None else None)
        self.runner = StepRunner(
            self.model, self.optimizer, self.train_stream, cfg.seq_len,
            log_interval=min(cfg.log_interval, self.limit),  # a ring no longer than the run
            profiler=self.profiler,
            profile_steps=cfg.profile_steps, graph=graph, warn=self.warn,
            shards=self.shards, sampler=sampler, averager=self.averager,
            shift=cfg.seed if cfg.random_offsets else None)

    def _build_outputs(self, checkpoint: str, claim: guard.Claim | None) -> None:
        """What measures and writes the trained model: checkpoints (each claimed file is
        replaced only when this run first writes it), evaluation, the step traffic they set
        aside, stop signals and the run's clock."""
        cfg, main = self.cfg, self.world.main
        self.ledger = TransferLedger(self.backend)
        self.checkpoints = RunCheckpoints(
            checkpoint, cfg, self.device, self.model, self.optimizer,
            self.corpus.vocab.to_array(), self.history, self.ledger.set_aside, self.warn,
            self.world.size, writes=main, barrier=self.comm.barrier if self.comm else None,
            tokenizer=self.corpus.tokenizer, averager=self.averager,
            replacing=claim.replacing if claim else None, data=self.data)
        self.evaluator = SplitEvaluator(self.model, self.corpus, cfg.batch_size, cfg.seq_len,
                                        cfg.eval_stride, self.progress, self.ledger.set_aside,
                                        cfg.eval_tokens)
        self.signals = StopSignals(self.say, self.checkpoints.on_disk)
        # Processes must stop at the same step: a stop request waits for the next agreement
        # (see Trainer._check_stop) instead of interrupting evaluation on one process only.
        self.signals.deferred = self.world.distributed
        self.clock = RunClock(self.runner, self.backend.synchronize, self.pos.step)

    # The history's parts, as the loop and the record read them.
    pos = property(lambda self: self.history.pos)
    losses = property(lambda self: self.history.losses)
    epoch_times = property(lambda self: self.history.epoch_times)
    checkpoint_path = property(lambda self: self.checkpoints.path)
    best_path = property(lambda self: self.checkpoints.best_file)

    @property
    def sharded(self) -> bool:
        """Whether the optimizer's state is sharded over the processes (ZeRO-1)."""
        return self.cfg.shard_optimizer and self.comm is not None

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
    writing.check_file_target(path, "trace file", "pass --trace a writable file path")


def check_precision(precision: str, kind: str, fallback: str | None) -> None:
    """Mixed precision is for the GPU; on the CPU (asked for, or fallen back to) say so."""
    if precision in GPU_ONLY and kind != "gpu":
        why = f" (the GPU is unusable: {fallback})" if fallback else ""
        raise ConfigError(f"PRECISION={precision} is GPU-only (mixed precision){why}: train "
                          f"with DEVICE=gpu, or use PRECISION=fp32 on the CPU")


def reduce_dtype(name: str, kind: str, fallback: str | None, distributed: bool,
                 warn: Callable[[str], None]) -> Any:
    """The dtype GRAD_REDUCE_DTYPE sums the gradient in (None: the gradient's own). bf16 is
    NCCL's, so the processes must be on GPUs; in one process nothing is summed."""
    if name == "fp32":
        return None
    if not distributed:
        warn(f"WARN: GRAD_REDUCE_DTYPE={name} in a single process: nothing to sum")
        return None
    if kind != "gpu":
        why = f" (the GPU is unusable: {fallback})" if fallback else ""
        raise TrainingError(
            f"GRAD_REDUCE_DTYPE={name} sums the gradient in NCCL's bf16, but this run's "
            f"processes are on the CPU{why}, where MPI sums float32 only: set "
            "GRAD_REDUCE_DTYPE=fp32, or train on GPUs")
    try:
        return bfloat16(f"GRAD_REDUCE_DTYPE={name}")
    except ImportError as e:
        raise TrainingError(str(e)) from None


def silent(_message: str) -> None:
    """What a data-parallel process other than rank 0 says: nothing (rank 0 speaks)."""
