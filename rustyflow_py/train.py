"""The training loop: device choice, data on the device, steps, evaluation, checkpoints, log.

A step is `zero_grad -> forward -> backward -> optimizer` with everything on the tensor's
device. The loss stays there too: each step writes it into a small device buffer that is read
back once every LOG_INTERVAL steps (one transfer), which is also where a non-finite loss is
caught and named by its exact step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import resource
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from . import checkpoint, data, logfile, report
from .backend import TRANSFERS, DeviceError, get_backend, gpu_unavailable_reason
from .config import Config
from .evaluate import perplexity
from .nn import GPT, GPTConfig
from .optim import SGD, AdamW, Optimizer, Schedule
from .profiler import Profiler
from .tensor import Tensor

Say = Callable[[str], None]


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, bad resume checkpoint, ...)."""


def resolve_device(requested: str, strict: bool, say: Say) -> tuple[str, str | None]:
    """The device to use and, when a requested GPU is not usable, why we fell back."""
    if requested == "cpu":
        return "cpu", None
    reason = gpu_unavailable_reason()
    if reason is None:
        from .devices import gpu_description

        say(f"INFO: Using GPU: {gpu_description()}")
        return "gpu", None
    if requested == "auto":
        return "cpu", None
    if strict:
        raise DeviceError(f"--device gpu: {reason} (STRICT_DEVICE=true, so no CPU fallback)")
    say(f"WARN: GPU requested but not usable, falling back to CPU ({reason})")
    return "cpu", reason


@dataclasses.dataclass
class Position:
    """Where training stands: completed steps, epoch, and batch index within the epoch."""

    step: int = 0
    epoch: int = 0
    batch: int = 0


class Trainer:
    """One training run of `cfg` on one device; `run()` returns the run record (SPEC §7)."""

    def __init__(
        self, cfg: Config, say: Say = print, resume: str | None = None,
        progress: Any = None, stop_after: int | None = None,
    ) -> None:
        self.cfg, self.say, self.progress = cfg, say, progress
        self.stop_after = stop_after  # tests: simulate Ctrl-C after this many steps
        self.device, self.fallback = resolve_device(cfg.device, cfg.strict_device, say)
        self.backend = get_backend(self.device)
        if self.device == "cpu":
            from .devices import set_threads

            set_threads(cfg.threads)
        self.dtype = np.float64 if cfg.precision == "fp64" else np.float32
        self.backend.set_precision(cfg.precision)
        self.corpus = data.load_corpus(cfg.dataset, cfg.data_dir or None)
        self.model = GPT(
            GPTConfig(len(self.corpus.vocab), cfg.seq_len, cfg.num_layers, cfg.num_heads,
                      cfg.embed_dim, cfg.dropout),
            self.device, cfg.seed, self.dtype,
        )
        self.train_stream = self._upload(self.corpus.train)
        self.steps_per_epoch = data.num_batches(self.train_stream, cfg.seq_len)
        if self.steps_per_epoch < 1:
            raise TrainingError(
                f"the training split ({self.corpus.train.size} tokens) is too small for "
                f"BATCH_SIZE={cfg.batch_size} x SEQ_LEN={cfg.seq_len}: reduce either"
            )
        self.total_steps = cfg.num_epochs * self.steps_per_epoch
        self.optimizer = self._make_optimizer()
        self.pos = Position()
        self.losses: list[float] = []  # every step's loss, read back in chunks
        self.epoch_times: list[float] = []
        self.val_ppl: float | None = None
        self.test_ppl: float | None = None
        self.phases = dict.fromkeys(("forward", "backward", "optimizer", "data", "eval"), 0.0)
        self.profiler = Profiler(self.backend) if cfg.profile else None
        self.checkpoint_path = cfg.model_path_for(self.device)
        if resume:
            self._restore(resume)
        self.backend.seed(cfg.seed + self.pos.step)
        xp = self.backend.xp
        self._loss_buf = xp.zeros(max(cfg.log_interval, 1), dtype=self.dtype)
        self._loss_fill = 0

    # ---- setup -------------------------------------------------------------------------------
    def _upload(self, tokens: np.ndarray) -> Any:
        """Batchify on the host, then move the whole split to the device once."""
        return self.backend.from_host(np.ascontiguousarray(
            data.batchify(tokens.astype(np.int32), self.cfg.batch_size)))

    def _make_optimizer(self) -> Optimizer:
        c = self.cfg
        schedule = Schedule(c.learning_rate, c.warmup_steps, self.total_steps, c.min_lr_ratio)
        if c.optimizer == "sgd":
            return SGD(self.model.buffer, schedule, c.momentum, c.nesterov, c.weight_decay,
                       c.grad_clip)
        return AdamW(self.model.buffer, schedule, (c.beta1, c.beta2), c.adam_eps,
                     c.weight_decay, c.grad_clip)

    def _restore(self, path: str) -> None:
        ckpt = checkpoint.Checkpoint(path)
        saved = {k: v for k, v in ckpt.config.items() if k in _SHAPE_KEYS}
        mine = {k: v for k, v in self.cfg.to_dict().items() if k in _SHAPE_KEYS}
        if saved != mine:
            diff = ", ".join(f"{k}={saved.get(k)} (checkpoint) vs {mine[k]}" for k in mine
                             if saved.get(k) != mine[k])
            raise TrainingError(f"--resume {path}: the checkpoint does not match this run: {diff}")
        if list(ckpt.vocab) != self.corpus.vocab.itos:
            raise TrainingError(f"--resume {path}: the checkpoint's vocabulary differs from "
                                f"the dataset's ({self.cfg.dataset})")
        self.model.buffer.load_state_dict(ckpt.weights)
        if not ckpt.optimizer:
            raise TrainingError(f"--resume {path}: the checkpoint holds no optimizer state")
        self.optimizer.load_state_dict(ckpt.optimizer)
        t = ckpt.meta["train"]
        self.pos = Position(t["step"], t["epoch"], t["batch"])
        self.losses = list(t["losses"])
        self.epoch_times = list(t["epoch_times"])
        self.val_ppl = t.get("val_ppl")
        self.say(f"Resumed from {path} at step {self.pos.step} (epoch {self.pos.epoch + 1}, "
                 f"batch {self.pos.batch})")

    # ---- the loop ----------------------------------------------------------------------------
    def step(self, x: Any, y: Any) -> None:
        """One optimizer step on device batch (x, y); the loss lands in the device buffer."""
        buffer, clock = self.model.buffer, time.perf_counter
        t0 = clock()
        buffer.zero_grad()
        loss = self.model(Tensor(x), Tensor(y))
        t1 = clock()
        loss.backward()
        t2 = clock()
        self.optimizer.step()
        t3 = clock()
        self._loss_buf[self._loss_fill] = loss.data
        self._loss_fill += 1
        self.phases["forward"] += t1 - t0
        self.phases["backward"] += t2 - t1
        self.phases["optimizer"] += t3 - t2

    def _drain_losses(self) -> None:
        """Read the buffered losses back (one transfer) and stop on a non-finite one."""
        if not self._loss_fill:
            return
        chunk = self.backend.to_host(self._loss_buf[: self._loss_fill]).tolist()
        first = self.pos.step - self._loss_fill + 1
        self._loss_fill = 0
        for i, value in enumerate(chunk):
            if not math.isfinite(value):
                raise TrainingError(
                    f"loss is {value} at step {first + i}: training diverged; lower "
                    f"LEARNING_RATE (now {self.cfg.learning_rate}) or set GRAD_CLIP"
                )
        self.losses.extend(chunk)

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        limit = cfg.max_steps or self.total_steps
        status, message = "completed", None
        start = time.perf_counter()
        TRANSFERS.reset()
        try:
            with self.profiler or contextlib.nullcontext():
                self._train(limit)
            if cfg.eval_interval == 0 or self.val_ppl is None:
                self.val_ppl = self.evaluate("valid")
            self.test_ppl = self.evaluate("test")
        except KeyboardInterrupt:
            status, message = "interrupted", f"interrupted at step {self.pos.step}"
            self.say(f"\nInterrupted at step {self.pos.step}: saving checkpoint and log block")
        except TrainingError as exc:
            status, message = "failed", str(exc)
        train_time = time.perf_counter() - start - self.phases["eval"]
        ckpt = self.save()
        record = self._record(status, message, train_time, ckpt)
        block = report.format_block(record)
        self.say(block)
        logfile.append_block(cfg.log_file, block)
        if status == "failed":
            raise TrainingError(message)
        if status == "interrupted":
            raise KeyboardInterrupt
        return record

    def _train(self, limit: int) -> None:
        cfg, clock = self.cfg, time.perf_counter
        nb = self.steps_per_epoch
        while self.pos.epoch < cfg.num_epochs and self.pos.step < limit:
            epoch_start = clock()
            if self.progress:
                self.progress.start_epoch(self.pos.epoch, nb, self.pos.batch)
            while self.pos.batch < nb and self.pos.step < limit:
                t0 = clock()
                x, y = data.get_batch(self.train_stream, self.pos.batch, cfg.seq_len)
                self.phases["data"] += clock() - t0
                self.step(x, y)
                if self.profiler:
                    self.profiler.step_end()
                self.pos.step += 1
                self.pos.batch += 1
                if self._loss_fill == len(self._loss_buf):
                    self._drain_losses()
                    if self.progress:
                        self.progress.update(self.pos, self.losses[-1], self._tokens_per_s())
                if self.stop_after is not None and self.pos.step >= self.stop_after:
                    raise KeyboardInterrupt
            self.backend.synchronize()
            self._drain_losses()
            if self.pos.batch < nb:
                break  # stopped by max_steps mid-epoch
            self.epoch_times.append(clock() - epoch_start)
            self.pos.epoch += 1
            self.pos.batch = 0
            self.val_ppl = self.evaluate("valid")
            self.say(f"epoch {self.pos.epoch}/{cfg.num_epochs}: {self.epoch_times[-1]:.2f}s, "
                     f"val ppl {self.val_ppl:.2f}")
            self.save()

    def _tokens_per_s(self) -> float:
        busy = self.phases["forward"] + self.phases["backward"] + self.phases["optimizer"]
        return self.pos.step * self.cfg.batch_size * self.cfg.seq_len / max(busy, 1e-9)

    def evaluate(self, split: str) -> float:
        """Perplexity over the whole split (exp of the mean per-token NLL)."""
        start = time.perf_counter()
        result = perplexity(self.model, getattr(self.corpus, split), self.cfg.batch_size,
                            self.cfg.seq_len)
        self.phases["eval"] += time.perf_counter() - start
        return result["perplexity"]

    # ---- output ------------------------------------------------------------------------------
    def save(self) -> str:
        """Write the checkpoint (weights, optimizer, position, config, vocab) atomically."""
        self._drain_losses()
        meta = {
            "config": self.cfg.to_dict(),
            "device": self.device,
            "train": {**dataclasses.asdict(self.pos), "losses": self.losses,
                      "epoch_times": self.epoch_times, "val_ppl": self.val_ppl},
        }
        checkpoint.save(self.checkpoint_path, self.model.buffer.state_dict(), meta,
                        self.corpus.vocab.to_array(), self.optimizer.state_dict())
        return self.checkpoint_path

    def _record(self, status: str, message: str | None, train_time: float,
                ckpt: str) -> dict[str, Any]:
        cfg, m = self.cfg, self.model.cfg
        steps_done = len(self.losses)
        tokens = steps_done * cfg.batch_size * cfg.seq_len
        step_time = train_time / max(steps_done, 1)
        avg_epoch = (sum(self.epoch_times) / len(self.epoch_times) if self.epoch_times
                     else None)
        return {
            "version": 1,
            "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "status": status,
            "device": self.device,
            "device_requested": cfg.device,
            "fallback_reason": self.fallback,
            "hardware": _hardware(self.device),
            "backend": self.backend.describe(),
            "dataset": cfg.dataset,
            "model": {"layers": m.n_layer, "heads": m.n_head, "embed": m.n_embd,
                      "seq_len": m.seq_len, "batch": cfg.batch_size, "vocab": m.vocab_size,
                      "params": self.model.num_params()},
            "precision": cfg.precision,
            "optimizer": cfg.optimizer,
            "graph": False,
            "epochs": len(self.epoch_times),
            "epochs_planned": cfg.num_epochs,
            "steps": steps_done,
            "steps_per_epoch": self.steps_per_epoch,
            "train_time_s": train_time,
            "avg_epoch_time_s": avg_epoch,
            "tokens_per_s": tokens / train_time if train_time > 0 else 0.0,
            "val_ppl": self.val_ppl,
            "test_ppl": self.test_ppl,
            "final_loss": self.losses[-1] if self.losses else None,
            "checkpoint": ckpt,
            "message": message,
            "profile": self._profile(steps_done, step_time) if self.profiler else None,
        }

    def _profile(self, steps: int, step_time: float) -> dict[str, Any]:
        prof = self.profiler
        assert prof is not None
        gpu = self.device == "gpu"
        phases = dict(self.phases)
        if gpu:  # device time per phase from the op events
            phases.update({k: v for k, v in prof.phase_times().items() if k in phases})
        out: dict[str, Any] = {
            "timing": "cuda-events" if gpu else "wall",
            "note": ("per-op device times from CUDA events, resolved once per step" if gpu
                     else "per-op wall times of every step"),
            "profiled_steps": prof.steps,
            "profiled_time_s": step_time * prof.steps,
            "ops": prof.ops(),
            "phases": phases,
            "host_launch_s": (self.phases["forward"] + self.phases["backward"]
                              + self.phases["optimizer"]) if gpu else None,
            "device_busy_s": prof.total() if gpu else None,
            "transfers": {**TRANSFERS.snapshot(), "steps": steps},
            "memory": _memory(self.backend),
            "matmul_floor": None if gpu else self._matmul_floor(step_time),
        }
        return out

    def _matmul_floor(self, step_time: float) -> dict[str, float]:
        """The step's matmul FLOPs at this machine's measured GEMM rate."""
        gflops = measure_gemm_gflops(self.cfg.batch_size * self.cfg.seq_len,
                                     self.cfg.embed_dim, len(self.corpus.vocab), self.dtype)
        flops = self.model.matmul_flops_per_step(self.cfg.batch_size, self.cfg.seq_len)
        return {"gflops": gflops, "flops_per_step": flops,
                "floor_s_per_step": flops / (gflops * 1e9), "step_s": step_time}


_SHAPE_KEYS = ("DATASET", "SEQ_LEN", "BATCH_SIZE", "EMBED_DIM", "NUM_HEADS", "NUM_LAYERS",
               "NUM_EPOCHS", "OPTIMIZER", "PRECISION")


def measure_gemm_gflops(m: int, k: int, n: int, dtype: Any, seconds: float = 0.3) -> float:
    """Sustained host GEMM rate on an (m, k) x (k, n) product, like the LM head's."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    a @ b  # warm-up
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        reps += 1
    return 2.0 * m * k * n * reps / (time.perf_counter() - start) / 1e9


def _hardware(device: str) -> str:
    from . import devices

    return devices.gpu_properties()["name"] if device == "gpu" else devices.cpu_name()


def _memory(backend: Any) -> dict[str, Any]:
    if backend.name == "gpu":
        pool = backend.xp.get_default_memory_pool()
        return {"kind": "gpu_pool", "peak_bytes": int(pool.total_bytes()),
                "pool_total_bytes": int(pool.total_bytes())}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"kind": "rss", "peak_bytes": int(peak), "pool_total_bytes": None}


def train(cfg: Config, say: Say = print, resume: str | None = None,
          progress: Any = None) -> dict[str, Any]:
    """Train per `cfg`; returns the run record also appended to the log."""
    Path(cfg.log_file).parent.mkdir(parents=True, exist_ok=True)
    return Trainer(cfg, say, resume, progress).run()
