"""The training loop: a thin driver over the step runner, evaluation, checkpoints and the log.

Everything that can make a run fail at its end is checked at its start: the output paths can
be written, every split fits the batch layout, a resume checkpoint matches. A stop request
(Ctrl-C, SIGTERM, SIGUSR1) finishes the current step, then writes a checkpoint and an
"interrupted" log block, so `--resume` continues exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from .. import data
from ..engine.backend import get_backend, resolve_device
from ..engine.profiler import Profiler
from ..errors import CheckpointError, TrainingError
from ..model.gpt import GPT, GPTConfig
from ..model.optim import SGD, AdamW, Optimizer, Schedule
from ..reporting import logfile, report
from . import checkpoint, outputs
from .config import Config
from .evaluate import perplexity, upload_split
from .record import build_record
from .signals import Stopped, StopSignals
from .step import StepRunner, quiet_float_errors

Say = Callable[[str], None]

# Keys that must match for a resume to make sense at all, and keys that may change but then
# the run no longer continues exactly (a warning names them). The rest (logging, devices,
# paths) never changes what is computed.
_SHAPE_KEYS = ("DATASET", "SEQ_LEN", "BATCH_SIZE", "EMBED_DIM", "NUM_HEADS", "NUM_LAYERS",
               "OPTIMIZER", "PRECISION")
_MATH_KEYS = ("NUM_EPOCHS", "LEARNING_RATE", "DROPOUT", "WEIGHT_DECAY", "BETA1", "BETA2",
              "ADAM_EPS", "MOMENTUM", "NESTEROV", "GRAD_CLIP", "WARMUP_STEPS", "MIN_LR_RATIO",
              "SEED")


@dataclasses.dataclass
class Position:
    """Where training stands: completed steps, epoch, and batch index within the epoch."""

    step: int = 0
    epoch: int = 0
    batch: int = 0


class Trainer:
    """One training run of `cfg` on one device; `run()` returns the run record.

    `say` gets progress and results, `warn` gets warnings (default: `say`; the command line
    sends them to stderr).
    """

    def __init__(self, cfg: Config, say: Say = print, resume: str | None = None,
                 progress: Any = None, warn: Say | None = None) -> None:
        self.cfg, self.say, self.progress = cfg, say, progress
        self.warn = warn or say
        outputs.check_log_file(cfg.log_file)
        self.device, self.fallback = resolve_device(cfg.device, cfg.strict_device, say,
                                                    self.warn)
        self.checkpoint_path = cfg.model_path_for(self.device)
        outputs.check_checkpoint_target(self.checkpoint_path)
        self.backend = get_backend(self.device)
        self.backend.configure(cfg.threads, cfg.cpu_jit, say, self.warn)
        self.backend.set_precision(cfg.precision)
        self.corpus = data.load_corpus(cfg.dataset, cfg.data_dir or None)
        data.check_layout(self.corpus, cfg.batch_size, cfg.seq_len)
        self.model = GPT(GPTConfig(len(self.corpus.vocab), cfg.seq_len, cfg.num_layers,
                                   cfg.num_heads, cfg.embed_dim, cfg.dropout),
                         self.device, cfg.seed, self.backend.dtype_for(cfg.precision))
        self.train_stream = upload_split(self.backend, self.corpus.train, cfg.batch_size)
        self._eval_streams: dict[str, Any] = {}  # valid/test, uploaded on first use
        self.steps_per_epoch = data.num_batches(self.train_stream, cfg.seq_len)
        self.total_steps = cfg.num_epochs * self.steps_per_epoch
        self.optimizer = self._make_optimizer()
        self.pos = Position()
        self._epoch_carry = 0.0  # seconds of the current epoch spent before a resume
        self.losses: list[float] = []  # every step's loss, read back in chunks
        self.epoch_times: list[float] = []
        self.val_ppl: float | None = None
        self.test_ppl: float | None = None
        self._val_step = -1  # the step at which val_ppl was measured
        self.profiler = Profiler(self.backend) if cfg.profile else None
        if resume:
            self._restore(resume)
        self.start_step = self.pos.step  # this process's steps are counted from here
        self.runner = StepRunner(
            self.model, self.optimizer, self.train_stream, cfg.seq_len,
            log_interval=cfg.log_interval, profiler=self.profiler,
            profile_steps=cfg.profile_steps, graph=self._want_graph(),
            dropout_seed=cfg.seed if cfg.dropout > 0 else None, warn=self.warn)
        self.signals = StopSignals(say)
        self.other_transfers = dict.fromkeys(self.backend.transfers.snapshot(), 0)
        self._epoch_start = self._run_start = time.perf_counter()
        self._in_step = False  # a stop forced inside a step must not overwrite the checkpoint

    # ---- setup -------------------------------------------------------------------------------
    def _make_optimizer(self) -> Optimizer:
        c = self.cfg
        schedule = Schedule(c.learning_rate, c.warmup_steps, self.total_steps, c.min_lr_ratio)
        if c.optimizer == "sgd":
            return SGD(self.model.buffer, schedule, c.momentum, c.nesterov, c.weight_decay,
                       c.grad_clip)
        return AdamW(self.model.buffer, schedule, (c.beta1, c.beta2), c.adam_eps,
                     c.weight_decay, c.grad_clip)

    def _restore(self, path: str) -> None:
        ckpt = checkpoint.Checkpoint(path, flag="--resume")
        saved, mine = ckpt.config, self.cfg.to_dict()
        shape = [k for k in _SHAPE_KEYS if saved.get(k) != mine[k]]
        if shape:
            diff = ", ".join(f"{k}={saved.get(k)} (checkpoint) vs {mine[k]}" for k in shape)
            raise TrainingError(f"--resume {path}: the checkpoint does not match this run: {diff}")
        if list(ckpt.vocab) != self.corpus.vocab.itos:
            raise TrainingError(f"--resume {path}: the checkpoint's vocabulary differs from "
                                f"the dataset's ({self.cfg.dataset})")
        buffer = self.model.buffer
        checkpoint.validate_against(
            ckpt, {n: t.shape for n, t in buffer.params.items()},
            self.optimizer.state_sizes(), flag="--resume")
        buffer.load_state_dict(ckpt.weights)
        self.optimizer.load_state_dict(ckpt.optimizer)
        t = ckpt.meta.get("train")
        if not isinstance(t, dict) or not {"step", "epoch", "batch"} <= t.keys():
            raise CheckpointError(f"--resume {path}: the checkpoint holds no training position "
                                  "(written by an older version, or damaged)")
        self.pos = Position(t["step"], t["epoch"], t["batch"])
        self.losses = list(t.get("losses", []))
        self.epoch_times = list(t.get("epoch_times", []))
        self.val_ppl = t.get("val_ppl")
        self._epoch_carry = t.get("epoch_elapsed", 0.0)
        changed = [k for k in _MATH_KEYS if saved.get(k) != mine[k]]
        if changed:
            self.warn("WARN: --resume with changed settings, so the run no longer continues "
                      "exactly: " + ", ".join(f"{k} {saved.get(k)} -> {mine[k]}"
                                              for k in changed))
        self.say(f"Resumed from {path} at step {self.pos.step} (epoch {self.pos.epoch + 1}, "
                 f"batch {self.pos.batch})")

    def _want_graph(self) -> bool:
        """Whether to replay the step as a CUDA graph (GRAPH=auto|on|off)."""
        mode = self.cfg.graph
        if mode == "off" or self.backend.kind != "gpu":
            if mode == "on":
                self.warn("WARN: GRAPH=on needs the GPU; training eagerly on the CPU")
            return False
        if self.cfg.dropout > 0:
            if mode == "on":
                self.warn("WARN: GRAPH=on: dropout draws fresh random masks every step, which "
                          "a replayed graph cannot; training eagerly (set DROPOUT=0 for graphs)")
            return False
        return True

    @property
    def limit(self) -> int:
        """The step the run stops at (MAX_STEPS, or the end of the last epoch)."""
        return min(self.cfg.max_steps or self.total_steps, self.total_steps)

    def nothing_left(self) -> bool:
        """A resumed run that is already complete: nothing to train, nothing to log."""
        return self.pos.step >= self.limit

    # ---- the run -----------------------------------------------------------------------------
    def run(self) -> report.RunRecord | None:
        """Train, evaluate, save, log. Returns the record (None if nothing was left to do);
        raises Stopped after an interrupted run and TrainingError after a failed one, both
        once the checkpoint and the log block are written."""
        if self.nothing_left():
            self._say_nothing_left()
            return None
        status, message, stop = "completed", None, None
        start = self._run_start = time.perf_counter()
        self.backend.transfers.reset()
        with self.signals.installed(), quiet_float_errors():
            try:
                self._train()
                if self._val_step != self.pos.step:
                    self._validate()
                self.test_ppl = self.evaluate("test")
            except Stopped as exc:
                stop = exc
                status, message = "interrupted", f"interrupted at step {self.pos.step}"
                self.say(f"\nInterrupted at step {self.pos.step} ({exc}): saving checkpoint "
                         "and log block")
            except TrainingError as exc:
                status, message = "failed", str(exc)
            train_time = time.perf_counter() - start  # evaluation included
            with self.signals.deferring():
                record = self._finish(status, message, train_time)
        if stop is not None:
            raise stop
        if status == "failed":
            raise TrainingError(message)
        return record

    def _say_nothing_left(self) -> None:
        done = (f"all {self.cfg.num_epochs} epoch(s)" if self.pos.step >= self.total_steps
                else f"MAX_STEPS={self.cfg.max_steps}")
        self.say(f"Nothing left to do: the checkpoint is at step {self.pos.step}, which "
                 f"completes {done}. To train longer, resume with --num-epochs "
                 f"{self.cfg.num_epochs + 1} (or more), or a larger --max-steps.")

    def _finish(self, status: str, message: str | None, train_time: float) -> report.RunRecord:
        """Checkpoint (not after a divergence), record, console summary, log block."""
        ckpt = None
        if status == "interrupted" and self._in_step:
            message = (f"{message} (inside a step: the checkpoint was not written, the last "
                       "one stays)")
        elif status != "failed":
            ckpt = self.save()
        record = build_record(self, status, message, train_time, ckpt)
        block = report.format_block(record)
        log = outputs.write_with_fallback(
            self.cfg.log_file, lambda path: logfile.append_block(path, block), "log block",
            self.warn, name="training_log.txt")
        self.say(report.format_summary(record, log))
        return record

    def _train(self) -> None:
        cfg, clock, nb = self.cfg, time.perf_counter, self.steps_per_epoch
        while self.pos.epoch < cfg.num_epochs and self.pos.step < self.limit:
            # a resumed run continues the epoch clock where the checkpoint left it
            self._epoch_start = clock() - self._epoch_carry
            self._epoch_carry = 0.0
            if self.progress:
                todo = min(nb, self.pos.batch + self.limit - self.pos.step)
                self.progress.start_epoch(self.pos.epoch, todo, self.pos.batch)
            while self.pos.batch < nb and self.pos.step < self.limit:
                with self.signals.deferring():
                    self._in_step = True
                    self.runner.run(self.pos.step)
                    self.pos.step += 1
                    self.pos.batch += 1
                    self._in_step = False
                if self.pos.step - len(self.losses) == len(self.runner.ring):
                    self._drain_losses()
                    if self.progress:
                        self.progress.update(self.pos, self.losses[-1], self._tokens_per_s())
                if cfg.eval_interval and self.pos.step % cfg.eval_interval == 0:
                    self._validate()
                self.signals.check()
            self.backend.synchronize()
            self._drain_losses()
            if self.pos.batch < nb:
                break  # stopped by MAX_STEPS mid-epoch
            self.epoch_times.append(clock() - self._epoch_start)
            self.pos.epoch += 1
            self.pos.batch = 0
            self.say(f"epoch {self.pos.epoch}/{cfg.num_epochs}: {self.epoch_times[-1]:.2f}s")
            if self._val_step != self.pos.step:
                self._validate()
            with self.signals.deferring():
                self.save()
            self.signals.check()

    def _drain_losses(self) -> None:
        advice = f"lower LEARNING_RATE (now {self.cfg.learning_rate:g})"
        if self.cfg.grad_clip <= 0:
            advice += " or set GRAD_CLIP (e.g. 1.0)"
        self.runner.drain(self.losses, self.pos.step, advice)

    def _validate(self) -> None:
        self.val_ppl = self.evaluate("valid")
        self._val_step = self.pos.step
        self.say(f"step {self.pos.step}: validation perplexity {self.val_ppl:.2f}")

    def _tokens_per_s(self) -> float:
        """This process's throughput so far (read at a loss drain, i.e. after a sync)."""
        elapsed = time.perf_counter() - self._run_start - self.runner.phases["eval"]
        steps = self.pos.step - self.start_step
        return steps * self.cfg.batch_size * self.cfg.seq_len / max(elapsed, 1e-9)

    def evaluate(self, split: str) -> float:
        """Perplexity over the whole split (exp of the mean per-token NLL)."""
        start = time.perf_counter()
        with self._not_step_traffic():
            if split not in self._eval_streams:
                self._eval_streams[split] = upload_split(
                    self.backend, getattr(self.corpus, split), self.cfg.batch_size)
            stream = self._eval_streams[split]
            status = (self.progress.evaluating(split, stream.size) if self.progress
                      else contextlib.nullcontext())
            with status:
                result = perplexity(self.model, stream, self.cfg.seq_len)
        self.runner.phases["eval"] += time.perf_counter() - start
        return result["perplexity"]

    @contextlib.contextmanager
    def _not_step_traffic(self) -> Iterator[None]:
        """Keep evaluation and checkpoint copies out of the per-step transfer counts."""
        before = self.backend.transfers.snapshot()
        try:
            yield
        finally:
            for key, value in self.backend.transfers.snapshot().items():
                self.other_transfers[key] += value - before[key]

    # ---- output ------------------------------------------------------------------------------
    def save(self) -> str | None:
        """Write the checkpoint (weights, optimizer, position, config, vocab) atomically; if its
        place cannot be written, to a fallback the warning names. Returns where it went."""
        self._drain_losses()
        meta = {
            "config": self.cfg.to_dict(),
            "device": self.device,
            "train": {**dataclasses.asdict(self.pos), "losses": self.losses,
                      "epoch_times": self.epoch_times, "val_ppl": self.val_ppl,
                      "epoch_elapsed": (time.perf_counter() - self._epoch_start
                                        if self.pos.batch else 0.0)},
        }
        with self._not_step_traffic():
            weights = self.model.buffer.state_dict()
            state = self.optimizer.state_dict()
            vocab = self.corpus.vocab.to_array()
            saved = outputs.write_with_fallback(
                self.checkpoint_path,
                lambda path: checkpoint.save(path, weights, meta, vocab, state),
                "checkpoint", self.warn)
        if saved is not None:
            self.checkpoint_path = saved
        return saved


def train(cfg: Config, say: Say = print, resume: str | None = None, progress: Any = None,
          warn: Say | None = None) -> report.RunRecord | None:
    """Train per `cfg`; returns the run record also appended to the log (None when a resumed
    run had nothing left to do)."""
    return Trainer(cfg, say, resume, progress, warn).run()
