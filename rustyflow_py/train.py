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
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from . import checkpoint, data, logfile, report
from .backend import TRANSFERS, DeviceError, get_backend, gpu_unavailable_reason
from .config import Config
from .errors import TrainingError
from .evaluate import perplexity, upload_split
from .gpu_memory import PeakMemory
from .graph import CapturedStep, GraphCaptureError
from .nn import GPT, GPTConfig
from .optim import SGD, AdamW, Optimizer, Schedule
from .profiler import Profiler
from .tensor import Tensor

Say = Callable[[str], None]


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
            self._load_cpu_kernels()
        self.dtype = np.float64 if cfg.precision == "fp64" else np.float32
        self.backend.set_precision(cfg.precision)
        self.corpus = data.load_corpus(cfg.dataset, cfg.data_dir or None)
        self.model = GPT(
            GPTConfig(len(self.corpus.vocab), cfg.seq_len, cfg.num_layers, cfg.num_heads,
                      cfg.embed_dim, cfg.dropout),
            self.device, cfg.seed, self.dtype,
        )
        self.train_stream = upload_split(self.backend, self.corpus.train, cfg.batch_size)
        self._eval_streams: dict[str, Any] = {}  # valid/test, uploaded on first use
        self.steps_per_epoch = data.num_batches(self.train_stream, cfg.seq_len)
        if self.steps_per_epoch < 1:
            raise TrainingError(
                f"the training split ({self.corpus.train.size} tokens) is too small for "
                f"BATCH_SIZE={cfg.batch_size} x SEQ_LEN={cfg.seq_len}: reduce either"
            )
        self.total_steps = cfg.num_epochs * self.steps_per_epoch
        self.optimizer = self._make_optimizer()
        self.pos = Position()
        self._epoch_carry = 0.0  # seconds of the current epoch spent before a resume
        self.losses: list[float] = []  # every step's loss, read back in chunks
        self.epoch_times: list[float] = []
        self.val_ppl: float | None = None
        self.test_ppl: float | None = None
        self.phases = dict.fromkeys(("forward", "backward", "optimizer", "data", "eval"), 0.0)
        self.profiler = Profiler(self.backend) if cfg.profile else None
        self.checkpoint_path = cfg.model_path_for(self.device)
        if resume:
            self._restore(resume)
        xp = self.backend.xp
        # Static batch buffers: each step gathers its batch into them on the device.
        self.x = xp.zeros((cfg.batch_size, cfg.seq_len), dtype=np.int32)
        self.y = xp.zeros_like(self.x)
        self._ring = xp.zeros(cfg.log_interval, dtype=self.dtype)  # step s's loss at (s-1) % n
        self._drained = self.pos.step  # self.losses holds the losses of steps 1.._drained
        self.graph = self._want_graph()
        self._captured: CapturedStep | None = None
        self._eager_pool_peak = 0  # default-pool size before the graph took over
        self.peak_memory = PeakMemory() if self.device == "gpu" else None
        self._steps_here = 0  # steps run by this process (warm-up and profiling window)
        self.profiled_wall = 0.0  # wall time of the profiled steps, including their sync
        self.window_host = 0.0  # host time spent issuing the profiled steps
        self._val_step = -1  # the step at which val_ppl was measured
        self._other_transfers = dict.fromkeys(TRANSFERS.snapshot(), 0)
        self._wall_start = time.perf_counter()
        self._steps_at_start = self.pos.step
        self._interrupt_requested = False
        self._in_step = False  # a forced stop inside a step must not overwrite the checkpoint
        self._epoch_start = time.perf_counter()

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
        self._epoch_carry = t.get("epoch_elapsed", 0.0)
        self.say(f"Resumed from {path} at step {self.pos.step} (epoch {self.pos.epoch + 1}, "
                 f"batch {self.pos.batch})")

    def _load_cpu_kernels(self) -> None:
        """CPU_JIT: load the numba kernels and compile them now, not inside the first step."""
        kernels = self.backend.fused
        kernels.set_jit(self.cfg.cpu_jit)
        if kernels.jit is None:
            return
        start = time.perf_counter()
        try:
            kernels.jit.warm_up()
        except Exception as exc:  # numba installed but unable to compile on this machine
            if self.cfg.cpu_jit == "on":
                raise TrainingError(f"CPU_JIT=on, but numba could not compile the CPU kernels "
                                    f"({type(exc).__name__}: {exc}); set CPU_JIT=auto or off "
                                    "to train with the NumPy kernels") from exc
            self.say(f"WARN: numba could not compile the CPU kernels ({type(exc).__name__}); "
                     "training with the NumPy kernels (CPU_JIT=off silences this)")
            kernels.set_jit("off")
            return
        seconds = time.perf_counter() - start
        if seconds > 1.0:
            self.say(f"numba CPU kernels compiled in {seconds:.1f}s (cached for later runs)")

    def _want_graph(self) -> bool:
        """Whether to replay the step as a CUDA graph (GRAPH=auto|on|off)."""
        mode = self.cfg.graph
        if mode == "off" or self.device != "gpu":
            if mode == "on":
                self.say("WARN: GRAPH=on needs the GPU; training eagerly on the CPU")
            return False
        if self.cfg.dropout > 0:
            if mode == "on":
                self.say("WARN: GRAPH=on: dropout draws fresh random masks every step, which a "
                         "replayed graph cannot; training eagerly (set DROPOUT=0 for graphs)")
            return False
        return True

    # ---- the loop ----------------------------------------------------------------------------
    def _step_body(self, timed: bool) -> None:
        """One optimizer step on the device: gather the batch, forward, backward, update, and
        put the loss in the ring. Reads nothing from the host, so it can be graph-captured."""
        clock, opt = time.perf_counter, self.optimizer
        t0 = clock()
        self.backend.fused.gather_batch(self.train_stream, opt.step_count, self.cfg.seq_len,
                                        self.x, self.y)
        t1 = clock()
        self.model.buffer.zero_grad()
        loss = self.model(Tensor(self.x), Tensor(self.y))
        t2 = clock()
        loss.backward()
        t3 = clock()
        opt.step()
        self.backend.fused.store_at_step(self._ring, opt.step_count, loss.data)
        if timed:
            for phase, dt in zip(("data", "forward", "backward", "optimizer"),
                                 (t1 - t0, t2 - t1, t3 - t2, clock() - t3), strict=True):
                self.phases[phase] += dt

    def _run_step(self) -> None:
        """Eager (profiled while in the window), or the captured graph once it exists."""
        if self._captured is not None:
            self._captured.replay()
            return
        if self.cfg.dropout > 0:  # masks depend on (seed, step) only: resume stays exact
            self.backend.seed(self.cfg.seed + self.pos.step)
        gpu = self.device == "gpu"
        window = 1 <= self._steps_here <= self.cfg.profile_steps
        if self.profiler is not None and (not gpu or window):
            start = time.perf_counter()
            with self.profiler, self._tracking_memory():
                self._step_body(timed=True)
            self.window_host += time.perf_counter() - start
            self.profiler.step_end()
            self.profiled_wall += time.perf_counter() - start
        elif self.graph and self._steps_here > (self.cfg.profile_steps if self.profiler else 0):
            self._capture()  # after 1 warm-up step (and the profiled window, if profiling)
        else:
            self._step_body(timed=True)
        self._steps_here += 1

    def _capture(self) -> None:
        """Record the step as a CUDA graph and run it; on failure, say why and stay eager."""
        captured = CapturedStep(self.backend, lambda: self._step_body(timed=False))
        try:
            with self._tracking_memory():
                captured.capture()
        except GraphCaptureError as exc:
            self.graph = False
            self.say(f"WARN: CUDA graph capture failed, training eagerly ({exc})")
            self._step_body(timed=True)
            return
        self._captured = captured
        # The eager steps' temporaries sit cached in the default pool; the graph has its own.
        pool = self.backend.xp.get_default_memory_pool()
        self._eager_pool_peak = int(pool.total_bytes())
        pool.free_all_blocks()
        captured.replay()

    def _tracking_memory(self) -> contextlib.AbstractContextManager[None]:
        """GPU: peak bytes in use during profiled eager steps and the graph capture."""
        return self.peak_memory.tracking() if self.peak_memory else contextlib.nullcontext()

    def _drain_losses(self) -> None:
        """Read the loss ring back (one transfer) and stop on a non-finite loss."""
        if self._drained == self.pos.step:
            return
        ring = self.backend.to_host(self._ring)
        n = len(ring)
        for step in range(self._drained + 1, self.pos.step + 1):
            value = float(ring[(step - 1) % n])
            if not math.isfinite(value):
                raise TrainingError(
                    f"loss is {value} at step {step}: training diverged; lower "
                    f"LEARNING_RATE (now {self.cfg.learning_rate}) or set GRAD_CLIP"
                )
            self.losses.append(value)
        self._drained = self.pos.step

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        limit = cfg.max_steps or self.total_steps
        status, message = "completed", None
        start = time.perf_counter()
        TRANSFERS.reset()
        self._wall_start = start
        try:
            self._train(limit)
            if self._val_step != self.pos.step:
                self._validate()
            self.test_ppl = self.evaluate("test")
        except KeyboardInterrupt:
            status, message = "interrupted", f"interrupted at step {self.pos.step}"
            self.say(f"\nInterrupted at step {self.pos.step}: saving checkpoint and log block")
        except TrainingError as exc:
            status, message = "failed", str(exc)
        train_time = time.perf_counter() - start  # evaluation included (report.py's contract)
        ckpt = None
        if status == "interrupted" and self._in_step:
            message += " (inside a step: the checkpoint was not written, the last one stays)"
        elif status != "failed":
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
        with self._deferred_interrupts():
            while self.pos.epoch < cfg.num_epochs and self.pos.step < limit:
                # a resumed run continues the epoch clock where the checkpoint left it
                self._epoch_start = clock() - self._epoch_carry
                self._epoch_carry = 0.0
                if self.progress:
                    self.progress.start_epoch(self.pos.epoch, nb, self.pos.batch)
                while self.pos.batch < nb and self.pos.step < limit:
                    self._in_step = True
                    self._run_step()
                    self.pos.step += 1
                    self.pos.batch += 1
                    self._in_step = False
                    if self.pos.step - self._drained == len(self._ring):
                        self._drain_losses()
                        if self.progress:
                            self.progress.update(self.pos, self.losses[-1],
                                                 self._tokens_per_s())
                    if cfg.eval_interval and self.pos.step % cfg.eval_interval == 0:
                        self._validate()
                    if self._interrupt_requested or (
                            self.stop_after is not None and self.pos.step >= self.stop_after):
                        raise KeyboardInterrupt
                self.backend.synchronize()
                self._drain_losses()
                if self.pos.batch < nb:
                    break  # stopped by max_steps mid-epoch
                self.epoch_times.append(clock() - self._epoch_start)
                self.pos.epoch += 1
                self.pos.batch = 0
                self.say(f"epoch {self.pos.epoch}/{cfg.num_epochs}: "
                         f"{self.epoch_times[-1]:.2f}s")
                if self._val_step != self.pos.step:
                    self._validate()
                self.save()

    @contextlib.contextmanager
    def _deferred_interrupts(self) -> Iterator[None]:
        """Ctrl-C takes effect at the end of the current step, so a checkpoint never pairs a
        half-applied update with the old position; a second Ctrl-C stops at once."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(_signum: int, _frame: Any) -> None:
            if self._interrupt_requested:
                raise KeyboardInterrupt
            self._interrupt_requested = True
            self.say("\nCtrl-C: stopping after this step (press again to stop at once)")

        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _validate(self) -> None:
        self.val_ppl = self.evaluate("valid")
        self._val_step = self.pos.step
        self.say(f"step {self.pos.step}: validation perplexity {self.val_ppl:.2f}")

    def _tokens_per_s(self) -> float:
        """Throughput of this process so far (read at a loss drain, i.e. after a sync)."""
        elapsed = time.perf_counter() - self._wall_start - self.phases["eval"]
        steps = self.pos.step - self._steps_at_start
        return steps * self.cfg.batch_size * self.cfg.seq_len / max(elapsed, 1e-9)

    def evaluate(self, split: str) -> float:
        """Perplexity over the whole split (exp of the mean per-token NLL)."""
        start = time.perf_counter()
        with self._not_step_traffic():
            if split not in self._eval_streams:
                self._eval_streams[split] = upload_split(
                    self.backend, getattr(self.corpus, split), self.cfg.batch_size)
            result = perplexity(self.model, self._eval_streams[split], self.cfg.seq_len)
        self.phases["eval"] += time.perf_counter() - start
        return result["perplexity"]

    @contextlib.contextmanager
    def _not_step_traffic(self) -> Iterator[None]:
        """Keep evaluation and checkpoint copies out of the per-step transfer counts."""
        before = TRANSFERS.snapshot()
        try:
            yield
        finally:
            for key, value in TRANSFERS.snapshot().items():
                self._other_transfers[key] += value - before[key]

    # ---- output ------------------------------------------------------------------------------
    def save(self) -> str:
        """Write the checkpoint (weights, optimizer, position, config, vocab) atomically."""
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
            checkpoint.save(self.checkpoint_path, self.model.buffer.state_dict(), meta,
                            self.corpus.vocab.to_array(), self.optimizer.state_dict())
        return self.checkpoint_path

    def _record(self, status: str, message: str | None, train_time: float,
                ckpt: str) -> dict[str, Any]:
        cfg, m = self.cfg, self.model.cfg
        steps_done = len(self.losses)
        tokens = steps_done * cfg.batch_size * cfg.seq_len
        steps_time = train_time - self.phases["eval"]
        step_time = steps_time / max(steps_done, 1)
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
            "graph": self._captured is not None,
            "epochs": len(self.epoch_times),
            "epochs_planned": cfg.num_epochs,
            "steps": steps_done,
            "steps_per_epoch": self.steps_per_epoch,
            "train_time_s": train_time,
            "avg_epoch_time_s": avg_epoch,
            "tokens_per_s": tokens / steps_time if steps_time > 0 else 0.0,
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
        mode = "CUDA-graph replay" if self._captured is not None else "eager"
        note = (f"per-op device times from CUDA events over an eager window of {prof.steps} "
                f"steps after 1 warm-up step; totals and epoch times from the whole {mode} run"
                if gpu else "per-op wall times of every step")
        return {
            "timing": "cuda-events" if gpu else "wall",
            "note": note,
            "profiled_steps": prof.steps,
            "profiled_time_s": self.profiled_wall,
            "ops": prof.ops(),
            "phases": phases,
            "host_launch_s": self.window_host if gpu else None,
            "device_busy_s": prof.total() if gpu else None,
            "transfers": {**{k: v - self._other_transfers[k]
                             for k, v in TRANSFERS.snapshot().items()}, "steps": steps},
            "memory": _memory(self.backend, self._captured, self._eager_pool_peak,
                              self.peak_memory),
            "matmul_floor": None if gpu else self._matmul_floor(step_time),
        }

    def _matmul_floor(self, step_time: float) -> dict[str, float]:
        """The step's matmul FLOPs at this machine's measured GEMM rate."""
        gflops = measure_gemm_gflops(self.backend.fused.matmul,
                                     self.cfg.batch_size * self.cfg.seq_len,
                                     self.cfg.embed_dim, len(self.corpus.vocab), self.dtype)
        flops = self.model.matmul_flops_per_step(self.cfg.batch_size, self.cfg.seq_len)
        return {"gflops": gflops, "flops_per_step": flops,
                "floor_s_per_step": flops / (gflops * 1e9), "step_s": step_time}


_SHAPE_KEYS = ("DATASET", "SEQ_LEN", "BATCH_SIZE", "EMBED_DIM", "NUM_HEADS", "NUM_LAYERS",
               "NUM_EPOCHS", "OPTIMIZER", "PRECISION")


def measure_gemm_gflops(matmul: Callable[[Any, Any], Any], m: int, k: int, n: int,
                        dtype: Any, seconds: float = 0.3) -> float:
    """Sustained GEMM rate of the kernels' own matmul (all its threads) on an (m, k) x (k, n)
    product, like the LM head's."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    matmul(a, b)  # warm-up
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        matmul(a, b)
        reps += 1
    return 2.0 * m * k * n * reps / (time.perf_counter() - start) / 1e9


def _hardware(device: str) -> str:
    from . import devices

    return devices.gpu_properties()["name"] if device == "gpu" else devices.cpu_name()


def _memory(backend: Any, captured: CapturedStep | None, eager_pool: int,
            peak: PeakMemory | None) -> dict[str, Any]:
    """GPU: peak bytes in use (tracked over the profiled steps and the capture) and the pools'
    reserved size (CuPy caches freed blocks): the larger of the eager phase's pool and the
    default pool plus the graph's private pool after it. CPU: the peak RSS."""
    if backend.name == "gpu":
        reserved = int(backend.xp.get_default_memory_pool().total_bytes())
        if captured is not None:
            reserved += captured.pool_bytes()
        reserved = max(reserved, eager_pool)
        used = peak.peak if peak is not None and peak.peak else reserved
        return {"kind": "gpu_pool", "peak_bytes": used, "pool_total_bytes": reserved}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"kind": "rss", "peak_bytes": int(peak), "pool_total_bytes": None}


def train(cfg: Config, say: Say = print, resume: str | None = None,
          progress: Any = None) -> dict[str, Any]:
    """Train per `cfg`; returns the run record also appended to the log."""
    Path(cfg.log_file).parent.mkdir(parents=True, exist_ok=True)
    return Trainer(cfg, say, resume, progress).run()
