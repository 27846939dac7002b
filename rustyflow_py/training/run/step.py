"""The step runner: one optimizer step on the device, eager, profiled, or replayed as a graph.

A step is `gather batch -> zero_grad -> forward -> backward -> optimizer` with everything on
the device. Its loss stays there too: each step writes it into a small device ring that is
read back once every LOG_INTERVAL steps (one transfer), which is also where a non-finite loss
is caught and named by its exact step.

On the GPU the first step is a warm-up (it compiles the kernels and makes the cuBLAS plans),
then the step is captured once as a CUDA graph and replayed; the profile samples some of those
replays (graph_profile.GraphSampler). With PROFILE_MODE=eager, PROFILE_STEPS eager steps with
per-op CUDA events (the profiled window) run before the capture instead. The warm-up step and
the capture are start-up (`startup`), timed apart from training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ...distributed.comm import Communicator
from ...engine.cupti_trace import CuptiUnavailable
from ...engine.graph import CapturedStep, GraphCaptureError
from ...engine.ops.cuda_build import kernel_cache_files
from ...engine.profiler import Profiler
from ...engine.tensor import Tensor, run_op
from ...errors import TrainingError
from ...model.gpt import GPT
from ...model.optim import Optimizer
from .graph_profile import GraphSampler

# the step's phases, then the run's time outside its steps: evaluation and checkpoint writes
PHASES = ("forward", "backward", "optimizer", "data", "eval", "checkpoint")


@dataclasses.dataclass
class Shards:
    """How a step's batch is split: `world` ranks x `accum` micro-steps each, this process
    being `rank`; `sync` sums the gradient over the ranks after the last backward
    (data_parallel.BucketedAllReduce or ReduceScatter; None in one process) and `comm` the
    loss."""

    rank: int = 0
    world: int = 1
    accum: int = 1
    comm: Communicator | None = None
    sync: Any = None

    @property
    def count(self) -> int:
        """Shards of the global batch: one per micro-step of every rank."""
        return self.world * self.accum


class StepRunner:
    """Runs steps of `model` on `stream` and keeps their losses, timings and memory peak."""

    def __init__(self, model: GPT, optimizer: Optimizer, stream: Any, seq_len: int, *,
                 log_interval: int, profiler: Profiler | None, profile_steps: int,
                 graph: bool, warn: Callable[[str], None],
                 shards: Shards | None = None, sampler: GraphSampler | None = None,
                 averager: Any = None, shift: int | None = None) -> None:
        self.model, self.optimizer, self.stream, self.seq_len = model, optimizer, stream, seq_len
        self.shift = shift  # RANDOM_OFFSETS: the seed of each epoch's row offsets, or None
        self.averager = averager  # folds each step's weights in (model/ema.py), or None
        self.shards = shards or Shards()
        self.backend = model.buffer.backend
        self.profiler, self.profile_steps, self.graph = profiler, profile_steps, graph
        self.sampler = sampler  # the replays' profile (None: the eager window, or the CPU's)
        self.warn = warn
        self.last_step = 0  # the run's final step number: a short run samples it
        # GPU start-up, kept out of the training time: the warm-up step (kernel compilation,
        # cuBLAS plans) and the graph capture, in seconds, and whether the kernel cache was cold
        self.startup: dict[str, Any] = {"first_step_s": 0.0, "capture_s": 0.0, "cache": None}
        # Dropout masks are drawn at (seed, steps done): the same counter the batch gather
        # reads, so every replay draws fresh masks and a resumed run draws the same ones. Each
        # micro-step's shard of the global batch draws masks of its own; the model is handed
        # them per call and keeps its own randomness.
        self.rngs = [dataclasses.replace(model.rng, step=optimizer.step_count, shard=shard)
                     for shard in range(self.shards.rank * self.shards.accum,
                                        (self.shards.rank + 1) * self.shards.accum)]
        xp, dtype = self.backend.xp, model.buffer.flat.dtype
        batch = stream.shape[0] // self.shards.count
        # Static batch buffers: each micro-step gathers its rows into them on the device.
        self.x = xp.zeros((batch, seq_len), dtype=np.int32)
        self.y = xp.zeros_like(self.x)
        self.ring = xp.zeros(log_interval, dtype=dtype)  # step s at (s-1) % n
        # fp16: whether each step was skipped for overflowing gradients (its loss may be inf
        # without the run having diverged: the scale halves and training goes on)
        self.skips = xp.zeros_like(self.ring) if optimizer.loss_scaler is not None else None
        # Each shard's backward is seeded with 1/shards, so the summed gradient is the mean;
        # its losses add up here (then over the ranks) into the step's mean loss.
        n = self.shards.count
        self.seed = xp.full((), 1.0 / n, dtype=dtype) if n > 1 else None
        self.loss_sum = xp.zeros((), dtype=dtype)
        self.captured: CapturedStep | None = None
        self.phases = dict.fromkeys(PHASES, 0.0)
        self.profiled_wall = 0.0  # wall time of the profiled steps, including their sync
        self.window_host = 0.0  # host time spent issuing the profiled steps
        self.steps_here = 0  # steps run by this runner (warm-up and profiling window)

    # ---- one step ----------------------------------------------------------------------------
    def _body(self, timed: bool, overlap: bool = True) -> None:
        """One optimizer step on the device: for each of this process's micro-steps gather
        its rows, forward and backward; sum the gradient over the ranks (overlapping the last
        backward when `overlap`); update; put the loss in the ring. Reads nothing from the
        host, so it can be graph-captured."""
        clock, opt, kernels, sh = time.perf_counter, self.optimizer, self.backend.kernels, \
            self.shards
        times = dict.fromkeys(("data", "forward", "backward", "optimizer"), 0.0)
        # the step's own bookkeeping runs through the op choke point too, so that every kernel
        # of a captured step belongs to an op; clearing the gradients is part of the step's
        # set-up, with the batch gather (the "data" phase), so each phase stays one stretch
        run_op("zero_grad", "other", "data", self.model.buffer.zero_grad)
        for k in range(sh.accum):
            t0 = clock()
            shard = sh.rank * sh.accum + k
            run_op("gather_batch", "other", "data",
                   lambda s=shard: kernels.gather_batch(self.stream, opt.step_count,
                                                         self.seq_len, self.x, self.y, rank=s,
                                                         world_size=sh.count,
                                                         shift=self.shift))
            t1 = clock()
            loss = self.model(Tensor.wrap(self.x, self.backend),
                              Tensor.wrap(self.y, self.backend), rng=self.rngs[k])
            t2 = clock()
            last = k == sh.accum - 1
            hook = sh.sync.start(overlap) if last and sh.sync is not None else None
            scaler = opt.loss_scaler
            loss.backward(self.seed if scaler is None else scaler.seed(sh.count), on_leaf=hook)
            if sh.count > 1:
                if k == 0:
                    self.loss_sum[...] = loss.data
                else:
                    self.loss_sum += loss.data
            t3 = clock()
            for phase, dt in zip(("data", "forward", "backward"), (t1 - t0, t2 - t1, t3 - t2),
                                 strict=True):
                times[phase] += dt
        t3 = clock()
        if sh.sync is not None:
            sh.sync.finish()
        value = loss.data
        if sh.count > 1:
            if sh.comm is not None:
                run_op("all_reduce_loss", "comm", "optimizer", sh.comm.all_reduce,
                       self.loss_sum)
            self.loss_sum *= 1.0 / sh.count
            value = self.loss_sum
        opt.step()
        if self.averager is not None:
            self.averager.after_step(opt.step_count)
        run_op("store_loss", "other", "optimizer", kernels.store_at_step, self.ring,
               opt.step_count, value)
        if self.skips is not None:
            run_op("store_loss", "other", "optimizer", kernels.store_at_step, self.skips,
                   opt.step_count, opt.loss_scaler.overflow)
        if timed:
            times["optimizer"] = clock() - t3
            for phase, dt in times.items():
                self.phases[phase] += dt

    def run(self, step: int) -> None:
        """Run step number `step` + 1 (`step` steps are done): eager (profiled while in the
        window), or the captured graph once it exists."""
        self.backend.make_current()  # CuPy's kernels on the stream cuBLAS and the graph use
        if self.captured is not None:
            if self.sampler is not None and self.sampler.due(step + 1 >= self.last_step):
                self.sampler.sample(self.captured.replay, self.backend.synchronize, step + 1)
            else:
                self.captured.replay()
            return
        gpu = self.backend.kind == "gpu"
        window = 1 <= self.steps_here <= self.profile_steps and self.sampler is None
        if gpu and self.steps_here == 0:
            self._warm_up()
        elif self.profiler is not None and (not gpu or window):
            start = time.perf_counter()
            with self.profiler, self.backend.tracking_memory():
                self._body(timed=True, overlap=False)
            self.window_host += time.perf_counter() - start
            self.profiler.step_end(step + 1)
            self.profiled_wall += time.perf_counter() - start
        elif self.graph and self.steps_here > (self.profile_steps if window_profiled(
                self.profiler, self.sampler) else 0):
            self._capture()  # after the warm-up step (and the eager window, if one is profiled)
        else:
            self._body(timed=True)
        self.steps_here += 1

    def _warm_up(self) -> None:
        """The first GPU step, eager and untimed by the profiler: it compiles the kernels it
        meets (CuPy caches them on disk: a cold cache grows here) and makes the GEMM plans."""
        cache = kernel_cache_files()
        start = time.perf_counter()
        with self.backend.tracking_memory():
            self._body(timed=False)
        self.backend.synchronize()
        self.startup["first_step_s"] = time.perf_counter() - start
        self.startup["cache"] = "cold" if kernel_cache_files() != cache else "warm"

    def _capture(self) -> None:
        """Record the step as a CUDA graph and run it; on failure, say why and stay eager."""
        captured = CapturedStep(self.backend, lambda: self._body(timed=False))
        start = time.perf_counter()
        try:
            with self.backend.tracking_memory():
                self._record(captured)
        except GraphCaptureError as exc:
            self._alone_fails(f"CUDA graph capture failed ({exc})", "GRAPH=off")
            self.graph = False
            self.warn(f"WARN: CUDA graph capture failed, training eagerly ({exc})")
            self._align()
            self._body(timed=True)
            return
        self._align()
        self.startup["capture_s"] = time.perf_counter() - start
        self.captured = captured
        self.backend.release_cached_memory()  # the eager steps' temporaries; the graph has its own
        captured.replay()

    def _align(self) -> None:
        """The ranks of a data-parallel run end their start-up together. Each one's clock
        starts training after its own capture; without this, a rank that got there first
        would count the wait for the slowest one (inside the first replay's collectives) as
        training time, and the ranks' clocks would disagree by that wait. Every rank comes
        here, whether its capture worked or not (a rank that failed trains eagerly)."""
        if self.shards.comm is not None:
            self.shards.comm.barrier()

    def _record(self, captured: CapturedStep) -> None:
        """Capture, tagging the nodes for the graph profile; if CUPTI refuses now (another
        tool took it since the run started), say so and capture without a profile."""
        if self.sampler is not None:
            try:
                self.sampler.capture(captured)
                return
            except CuptiUnavailable as exc:
                self._alone_fails(str(exc), "PROFILE_MODE=eager")
                self.sampler = None
                self.warn(f"WARN: no per-op profile for this run: {exc}")
        captured.capture()

    def _alone_fails(self, what: str, fix: str) -> None:
        """In a data-parallel run whose ranks sample the same replays, a rank cannot drop its
        graph or its profile alone: the others would wait for it in the sampling agreement for
        ever. So the run fails, naming the cause and the setting that avoids it."""
        if self.sampler is not None and self.sampler.agree is not None:
            raise TrainingError(f"{what}; the ranks of a data-parallel run profile the same "
                                f"replays, so this one cannot go on without them: set {fix}")

    def release_graph(self) -> None:
        """Free the captured step. NCCL reclaims what a graph captured of its communicator
        only when that graph is destroyed, and until then tearing the communicator down
        waits (forever), so a data-parallel run drops its graph first."""
        self.captured = None
        gc.collect()

    # ---- losses ------------------------------------------------------------------------------
    def drain(self, losses: list[float], last: int, advice: str) -> None:
        """Append the losses of the steps after len(losses) up to `last` (at most one ring
        apart), read back in one transfer; a non-finite one stops the run, naming its step and
        `advice`, with the losses before it kept, unless loss scaling skipped that step."""
        first = len(losses) + 1
        if last < first:
            return
        ring = self.backend.to_host(self.ring)
        skips = self.backend.to_host(self.skips) if self.skips is not None else None
        n = len(ring)
        for step in range(first, last + 1):
            value = float(ring[(step - 1) % n])
            skipped = skips is not None and skips[(step - 1) % n] > 0
            if not math.isfinite(value) and not skipped:
                raise TrainingError(f"loss is {value} at step {step}: training diverged; "
                                    f"{advice}")
            losses.append(value)

    # ---- what the record needs ------------------------------------------------------------------
    def memory(self) -> dict[str, Any]:
        """GPU: peak bytes in use over the profiled steps and the capture, and the pools'
        reserved size (CuPy caches freed blocks, the graph has a private pool). CPU: peak RSS."""
        extra = self.captured.pool_bytes() if self.captured is not None else 0
        return self.backend.memory_stats(extra)


def window_profiled(profiler: Profiler | None, sampler: GraphSampler | None) -> bool:
    """Whether eager steps are profiled before the capture (the eager window)."""
    return profiler is not None and sampler is None


def use_graph(mode: str, kind: str, warn: Callable[[str], None]) -> bool:
    """Whether to replay the step as a CUDA graph (GRAPH=auto|on|off), saying why not when
    GRAPH=on cannot be honoured. Dropout is no obstacle: its masks are drawn on the device
    from the step counter."""
    if mode == "off" or kind != "gpu":
        if mode == "on":
            warn("WARN: GRAPH=on needs the GPU; training eagerly on the CPU")
        return False
    return True


@contextlib.contextmanager
def quiet_float_errors() -> Any:
    """A diverging run overflows somewhere before its loss turns inf; the loss check names the
    step, so NumPy's RuntimeWarnings on the way are noise."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        yield
