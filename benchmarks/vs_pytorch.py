"""RustyFlow vs PyTorch on one device: step time, throughput, peak memory, loss-curve agreement.

Both frameworks train the same GPT from the same initial weights (`init_weights(cfg, SEED)`)
with the same step: zero grad, forward, backward, clip the global grad norm to 1.0, AdamW.
For every shape and precision it times RustyFlow (eager, and CUDA-graph replay on the GPU; on the
CPU also eager with CPU_JIT=off, the pure-NumPy kernels, when numba is installed) and
PyTorch (eager, and torch.compile mode="reduce-overhead" by default on the GPU), then trains
both for --curve-steps steps on WikiText-2 at each --curve-precisions precision and reports how
far the loss curves drift apart, against a bound per precision.
On the CPU each timing runs in a worker process of its own, so the peak RSS it reports is that
framework's alone; on the GPU everything runs in this process, memory freed between runs.

Precisions: fp32 everywhere; on the GPU also tf32 (TF32 GEMMs), and the mixed precisions bf16
and fp16. There RustyFlow keeps float32 master weights, gradients and AdamW state and runs
forward and backward on a 16-bit copy of the weights (GEMMs accumulate in fp32); fp16 adds
dynamic loss scaling. PyTorch keeps its fp32 model and runs forward + loss under
torch.autocast at the same 16-bit dtype, backward outside it, fp16 with a GradScaler: the
usual way to train in 16 bits in each framework, compared at the same precision.

GPT-2 124M (`--shapes gpt2-b16,gpt2-b32`: L12 H12 E768, T 1024, vocabulary padded to 50,304,
GPU-only) is compared with a nanoGPT-style PyTorch step: torch.compile in its default mode,
fused AdamW, scaled_dot_product_attention(is_causal=True), bf16 autocast; with MFU counted as
nanoGPT does (mfu.py) and, with --kernel-list, every kernel of rustyflow's replayed step
(kernel_list.py).

    python benchmarks/vs_pytorch.py --device cpu --out benchmarks/results/cpu-<machine>.md
    python benchmarks/vs_pytorch.py --device gpu --out benchmarks/results/<gpu>.md
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # time the working tree's package, installed or not

from rustyflow_py import data  # noqa: E402
from rustyflow_py.engine import backend, devices  # noqa: E402
from rustyflow_py.engine.backend import Backend, gpu_unavailable_reason  # noqa: E402
from rustyflow_py.engine.graph import CapturedStep, GraphCaptureError  # noqa: E402
from rustyflow_py.engine.library import get_backend  # noqa: E402
from rustyflow_py.engine.memory import PeakMemory  # noqa: E402
from rustyflow_py.engine.ops.attention import cudnn  # noqa: E402
from rustyflow_py.engine.policy import RunPolicy  # noqa: E402
from rustyflow_py.engine.precision import Precision, bfloat16  # noqa: E402
from rustyflow_py.engine.tensor import Tensor  # noqa: E402
from rustyflow_py.model.gpt import GPT, GPTConfig, init_weights  # noqa: E402
from rustyflow_py.model.loss_scale import INIT_SCALE, LossScaler  # noqa: E402
from rustyflow_py.model.optim import AdamW, Schedule  # noqa: E402
from rustyflow_py.training.outputs.writing import write_atomically  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))  # its sibling modules, when loaded by path
import mfu  # noqa: E402
from kernel_list import KernelLister  # noqa: E402
from kernel_list import render as render_kernels  # noqa: E402

SHAPES = {  # the benchmark shapes: layers, heads, embed, seq_len, batch
    "seed": (2, 4, 128, 64, 16),
    "small": (6, 6, 384, 256, 32),
    "medium": (12, 12, 768, 512, 16),
    "gpt2-b16": (12, 12, 768, 1024, 16),  # GPT-2 124M at its context, as nanoGPT trains it
    "gpt2-b32": (12, 12, 768, 1024, 32),
}
VOCAB = 33278  # WikiText-2's
# GPT-2's 50,257 tokens padded to a multiple of 64, as nanoGPT pads them (its GPTConfig)
SHAPE_VOCAB = {"gpt2-b16": 50304, "gpt2-b32": 50304}
GPU_SHAPES = ("gpt2-b16", "gpt2-b32")  # a 2-core CPU would take minutes a step
SEED = 1337
LR, WARMUP, MIN_RATIO, CLIP = 1e-3, 100, 0.1, 1.0  # config.env's defaults
DEFAULT_STEPS = {  # (warm-up, timed) steps per shape: a 2-core CPU takes ~10 s a small step
    "cpu": {"seed": (3, 10), "small": (2, 5), "medium": (1, 3)},
    "gpu": {"seed": (10, 50), "small": (10, 40), "medium": (5, 20), "gpt2-b16": (5, 30),
            "gpt2-b32": (5, 20)},
}
MiB, GiB = 2**20, 2**30
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp8-delayed")
GPU_DEFAULT = PRECISIONS[:4]  # fp8 only when asked for: its rows need bf16's beside them
# TF32 is a GPU GEMM mode; the rest GPU-only
GPU_ONLY = ("tf32", "bf16", "fp16", "fp8", "fp8-delayed")
# max relative loss difference; fp8 is held to PyTorch's bf16 (mfu.PEER: PyTorch trains no
# GEMM in FP8 without Transformer Engine or torchao), with bf16's bound
CURVE_BOUNDS = {"fp32": 0.01, "bf16": 0.02, "fp16": 0.02, "fp8": 0.02, "fp8-delayed": 0.02}
# PyTorch's fp32-matmul mode under autocast: TF32 allowed, as in the tf32 rows. Autocast runs
# every GEMM of this model (Linear, attention, the tied head) in 16 bits, so none is left.
AUTOCAST_MATMUL = "high"
# torch.compile modes: reduce-overhead (CUDA graphs) is the reference at the older shapes;
# GPT-2 gets nanoGPT's plain torch.compile(model), i.e. "default"
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

StepFn = Callable[[Any, Any], Any]  # step(x, y) -> the loss, left on the device


class NotAvailable(RuntimeError):
    """This framework/mode cannot run here; the row says so instead of showing a number."""


@dataclasses.dataclass(frozen=True)
class Job:
    """One timed configuration (also the --worker payload)."""

    device: str
    shape: str
    precision: str
    framework: str  # rustyflow | pytorch
    mode: str  # eager | numpy (rustyflow eager, CPU_JIT=off) | graph (rustyflow) | compile
    warmup: int
    steps: int
    windows: int
    threads: int
    compile_mode: str = ""  # torch.compile's mode, for mode "compile"
    attention: str = "auto"  # rustyflow's ATTENTION
    head_chunk: int = 0  # rustyflow's LM_HEAD_CHUNK
    adam_state: str = "fp32"  # rustyflow's ADAM_STATE_DTYPE

    def label(self) -> str:
        """`rustyflow graph`, `rustyflow graph [cudnn]`, `rustyflow graph [head 2048 rows]`,
        `rustyflow graph [bf16 moments]`, `pytorch compile (default)`."""
        mode = f"{self.mode} ({self.compile_mode})" if self.compile_mode else self.mode
        chosen = f" [{self.attention}]" if self.attention != "auto" else ""
        chunk = f" [head {self.head_chunk} rows]" if self.head_chunk else ""
        state = f" [{self.adam_state} moments]" if self.adam_state != "fp32" else ""
        return f"{self.framework} {mode}{chosen}{chunk}{state}"


def gpt_config(shape: str, vocab: int | None = None) -> tuple[GPTConfig, int]:
    """The shape's model (its own vocabulary unless `vocab` is given) and batch size."""
    layers, heads, embed, seq_len, batch = SHAPES[shape]
    vocab = vocab if vocab is not None else SHAPE_VOCAB.get(shape, VOCAB)
    return GPTConfig(vocab, seq_len, layers, heads, embed), batch


def describe_shape(shape: str) -> str:
    layers, heads, embed, seq_len, batch = SHAPES[shape]
    vocab = f" V{SHAPE_VOCAB[shape]}" if shape in SHAPE_VOCAB else ""
    return f"{shape} (L{layers} H{heads} E{embed} T{seq_len} B{batch}{vocab})"


def synthetic_batch(cfg: GPTConfig, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Uniform random tokens: timing does not depend on the text, only on the shapes."""
    rng = np.random.default_rng(SEED)
    tokens = rng.integers(0, cfg.vocab_size, size=(batch, cfg.seq_len + 1), dtype=np.int32)
    return np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])


# ---- HOOK: the RustyFlow training step that is timed ---------------------------------------------
def rustyflow_step_fn(model: GPT, optimizer: AdamW, mode: str, scaler: Any = None,
                      capture: Callable[[CapturedStep], None] | None = None) -> StepFn:
    """RustyFlow's training step from its public API, as Trainer.step runs it.

    "eager" runs zero_grad -> forward -> backward -> optimizer.step (clip + AdamW) each call;
    with an fp16 loss `scaler` (attached to the optimizer, which unscales and skips on
    overflow) backward is seeded with the scale, a device array, so the step stays
    capturable. "graph" captures that same step once as a CUDA graph
    (rustyflow_py.engine.graph.CapturedStep) and replays it; NotAvailable when the capture
    fails. `capture` replaces CapturedStep.capture (a kernel list's, which tags every
    node with its op).
    """

    backend = model.buffer.backend

    def eager(x: Any, y: Any) -> Any:
        model.buffer.zero_grad()
        loss = model(Tensor.wrap(x, backend), Tensor.wrap(y, backend))
        loss.backward(None if scaler is None else scaler.seed(1))
        optimizer.step()
        return loss.data

    if mode in ("eager", "numpy"):
        return eager
    if mode != "graph":
        raise ValueError(f"unknown RustyFlow mode {mode!r}")
    if model.device != "gpu":
        raise NotAvailable("CUDA graphs need the GPU")
    return GraphStep(eager, model.buffer.backend, capture)


def rustyflow_training(
    cfg: GPTConfig, backend: Backend, total_steps: int, adam_state: str = "fp32"
) -> tuple[GPT, AdamW, Any]:
    """GPT + AdamW on `backend` at its policy's precision (its moments in float32, or bf16:
    ADAM_STATE_DTYPE), and the loss scaler (None unless the precision scales the loss).

    fp32/tf32 build the model as always. bf16/fp16 keep float32 master weights, gradients and
    optimizer state (`storage`) and run forward/backward on a 16-bit copy (`compute`) that
    the optimizer refreshes at the end of every step; fp16 also scales the loss.
    """
    p = backend.policy.precision
    sched = Schedule(LR, WARMUP, total_steps, MIN_RATIO)
    state = bfloat16() if adam_state == "bf16" else None
    if p.compute == p.storage:
        model = GPT(cfg, backend, SEED)  # initialised with init_weights(cfg, SEED)
        return model, AdamW(model.buffer, sched, grad_clip=CLIP, state_dtype=state), None
    model = GPT(cfg, backend, SEED, dtype=p.storage, compute=p.compute)
    opt = AdamW(model.buffer, sched, grad_clip=CLIP, state_dtype=state)
    scaler = None
    if p.loss_scaling:
        scaler = LossScaler(model.buffer.backend.xp)
        opt.loss_scaler = scaler
    return model, opt, scaler


def host_float(backend: Any, array: Any) -> float:
    """A 0-d device array as a Python float (via float32: a bfloat16 host array included)."""
    return float(np.asarray(backend.to_host(array)).astype(np.float32))


class GraphStep:
    """The eager step recorded once as a CUDA graph on static batch buffers, then replayed."""

    def __init__(self, eager: StepFn, backend: Any,
                 capture: Callable[[CapturedStep], None] | None = None) -> None:
        self.eager, self.backend = eager, backend
        self.capture = capture or CapturedStep.capture
        self.make, self.error = CapturedStep, GraphCaptureError
        self.captured: Any = None
        self.x = self.y = self.loss = None
        self.peak = PeakMemory()  # in use while capturing: what every replay needs

    def __call__(self, x: Any, y: Any) -> Any:
        if self.captured is None:
            self.x, self.y = x.copy(), y.copy()
            self.eager(self.x, self.y)  # one eager step first: every kernel compiled, no capture
            # the graph's temporaries live in its own pool: drop the eager step's cached ones
            self.backend.xp.get_default_memory_pool().free_all_blocks()
            self.captured = self.make(self.backend, self._body)
            try:
                with self.peak.tracking():
                    self.capture(self.captured)
            except self.error as exc:
                raise NotAvailable(f"capture failed: {exc}") from None
        else:
            self.x[...] = x
            self.y[...] = y
        self.captured.replay()
        return self.loss

    def _body(self) -> None:
        self.loss = self.eager(self.x, self.y)

    def pool_bytes(self) -> int:
        return self.captured.pool_bytes() if self.captured is not None else 0


def pytorch_step_fn(model: Any, optimizer: Any, mode: str, precision: str = "fp32",
                    scaler: Any = None, compile_mode: str = "reduce-overhead") -> StepFn:
    """The same step in PyTorch; "compile" compiles the model (forward + loss, and so its
    backward) with torch.compile's `compile_mode` ("reduce-overhead": CUDA graphs on the GPU;
    "default": nanoGPT's `torch.compile(model)`), the clip and fused AdamW stay eager, as in
    nanoGPT's train.py.

    bf16/fp16 run forward + loss under torch.autocast, backward outside it (autocast's
    recipe); fp16's GradScaler scales the loss, and unscales the gradients before the clip so
    the clip sees true norms, then steps (skipping on overflow) and updates its scale.
    """
    import torch

    params = list(model.parameters())
    forward = model
    if mode == "compile":
        torch._dynamo.reset()
        if compile_mode not in COMPILE_MODES:
            raise ValueError(f"unknown torch.compile mode {compile_mode!r}")
        forward = torch.compile(model, mode=compile_mode)
    elif mode != "eager":
        raise ValueError(f"unknown PyTorch mode {mode!r}")
    amp = autocast_dtype(precision)

    def step(x: Any, y: Any) -> Any:
        if mode == "compile":  # CUDA-graph modes: a new step; the others ignore it
            torch.compiler.cudagraph_mark_step_begin()
        optimizer.zero_grad(set_to_none=True)
        with (contextlib.nullcontext() if amp is None
              else torch.autocast("cuda", dtype=amp)):
            loss = forward(x, y)
        if scaler is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            scaler.step(optimizer)  # fused AdamW: skips on overflow without a host sync
            scaler.update()
        return loss

    return step


def peer(precision: str) -> str:
    """The precision PyTorch's rows and curves run for RustyFlow's `precision`."""
    return mfu.PEER.get(precision, precision)


def autocast_dtype(precision: str) -> Any:
    """The torch dtype PyTorch autocasts to at `precision`; None for fp32/tf32 (no autocast)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def torch_model(cfg: GPTConfig, device: str) -> tuple[Any, Any]:
    """The PyTorch reference with RustyFlow's initial weights, and its AdamW."""
    import torch
    from torch_gpt import TorchGPT, make_adamw

    model = TorchGPT(cfg.vocab_size, cfg.seq_len, cfg.n_layer, cfg.n_head, cfg.n_embd)
    model.load_from_rustyflow(host_init_weights(cfg))
    model.to(torch.device("cuda" if device == "gpu" else "cpu"))
    return model, make_adamw(model, LR, fused=True)


@functools.lru_cache(maxsize=1)
def host_init_weights(cfg: GPTConfig) -> dict[str, np.ndarray]:
    """`init_weights(cfg, SEED)`, made once per model: GPT-2's 124M host weights take seconds,
    and every PyTorch row of a shape (eager, each compile mode, both batch sizes) starts
    from them. Read-only: load_from_rustyflow copies them."""
    return init_weights(cfg, SEED)


def torch_training(cfg: GPTConfig, device: str, precision: str) -> tuple[Any, Any, Any]:
    """The PyTorch model (fp32 at every precision), its AdamW, and fp16's GradScaler (its
    defaults are RustyFlow's LossScaler's: 2**16, x2 per 2000 clean steps, x0.5 on overflow)."""
    import torch

    model, opt = torch_model(cfg, device)
    return model, opt, torch.amp.GradScaler("cuda") if precision == "fp16" else None


def set_torch_precision(device: str, precision: str) -> None:
    import torch

    if device != "gpu" or precision == "fp32":
        mode = "highest"
    else:
        mode = "high" if precision == "tf32" else AUTOCAST_MATMUL
    torch.set_float32_matmul_precision(mode)


# ---- timing -----------------------------------------------------------------------------------
def time_steps(
    step: StepFn, x: Any, y: Any, job: Job, sync: Callable[[], None]
) -> tuple[list[float], Any]:
    """Seconds per step in each of job.windows timed windows (after job.warmup steps), and
    the last loss. The device is synchronised before every clock read."""
    loss = None
    for _ in range(job.warmup):
        loss = step(x, y)
    sync()
    times = []
    for window in np.array_split(np.arange(job.steps), job.windows):
        start = time.perf_counter()
        for _ in window:
            loss = step(x, y)
        sync()
        times.append((time.perf_counter() - start) / len(window))
    return times, loss


def free_gpu_memory() -> None:
    """Return cached blocks of both allocators, so each run's peak starts from nothing."""
    gc.collect()
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    if "torch" in sys.modules:
        import torch

        torch.cuda.empty_cache()


def policy_of(precision: str, **settings: Any) -> RunPolicy:
    """The RunPolicy of a precision name: fp8-delayed is PRECISION=fp8, FP8_SCALING=delayed."""
    base, _, scaling = precision.partition("-")
    return RunPolicy(Precision.of(base), fp8_scaling=scaling or "current", **settings)


def measure_rustyflow(job: Job, lister: KernelLister | None = None) -> dict[str, Any]:
    """RustyFlow's row; with a `lister`, a graph row also lists its step's kernels (sampled
    replays after the timed ones)."""
    backend = get_backend(job.device, policy_of(
        job.precision, attention=job.attention, threads=job.threads, head_chunk=job.head_chunk,
        graph="auto" if job.mode == "graph" else "off",
        cpu_jit="off" if job.mode == "numpy" else "auto"))
    base = rss_bytes()
    cfg, batch = gpt_config(job.shape)
    x, y = (backend.from_host(a) for a in synthetic_batch(cfg, batch))
    model, opt, scaler = rustyflow_training(cfg, backend, 10**6, job.adam_state)
    sampler = lister.sampler(backend) if lister is not None and job.mode == "graph" else None
    capture = functools.partial(lister.capture, sampler) if sampler is not None else None
    step = rustyflow_step_fn(model, opt, job.mode, scaler, capture)
    times, loss = time_steps(step, x, y, job, backend.synchronize)
    out: dict[str, Any] = {"times": times, "loss": host_float(backend, loss)}
    if scaler is not None:
        state = scaler.state(backend.to_host)
        out["scaler"] = f"scale {state['scale']:g}, {state['skipped']} skipped"
    if job.device == "gpu":
        if isinstance(step, GraphStep):
            peak = step.peak
        else:  # one more step, tracked (the hook's bookkeeping stays out of the timing)
            peak = PeakMemory()
            with peak.tracking():
                step(x, y)
            backend.synchronize()
        pool = int(backend.xp.get_default_memory_pool().total_bytes())
        graph = step.pool_bytes() if isinstance(step, GraphStep) else 0
        out["memory"] = (f"{peak.peak / GiB:.2f} GiB in use, {(pool + graph) / GiB:.2f} "
                         "reserved")
        out["peak_bytes"] = peak.peak
    if sampler is not None and sampler.profiler.graph is not None:  # tagged at capture
        kernels = lister.sample(sampler, step.captured.replay, backend.synchronize)
        out["kernels"] = render_kernels(
            f"{describe_shape(job.shape)}, {job.precision}, {job.label()}", kernels)
    else:
        out["memory"], out["peak_bytes"] = rss_text(base), rss_bytes()
    return out


def measure_pytorch(job: Job) -> dict[str, Any]:
    import torch

    set_torch_precision(job.device, job.precision)
    cuda = job.device == "gpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        torch.set_num_threads(job.threads or os.cpu_count() or 1)
    base = rss_bytes()
    cfg, batch = gpt_config(job.shape)
    dev = "cuda" if cuda else "cpu"
    x, y = (torch.from_numpy(a.astype(np.int64)).to(dev) for a in synthetic_batch(cfg, batch))
    model, opt, scaler = torch_training(cfg, job.device, job.precision)
    step = pytorch_step_fn(model, opt, job.mode, job.precision, scaler,
                           job.compile_mode or "reduce-overhead")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    warm = dataclasses.replace(job, warmup=max(job.warmup, 3)) if job.mode == "compile" else job
    times, loss = time_steps(step, x, y, warm, sync)
    out: dict[str, Any] = {"times": times, "loss": float(loss.item())}
    if scaler is not None:
        out["scaler"] = torch_scaler_text(scaler, warm.warmup + warm.steps)
    if cuda:
        out["memory"] = (f"{torch.cuda.max_memory_allocated() / GiB:.2f} GiB allocated, "
                         f"{torch.cuda.max_memory_reserved() / GiB:.2f} reserved")
        out["peak_bytes"] = torch.cuda.max_memory_allocated()
    else:
        out["memory"], out["peak_bytes"] = rss_text(base), rss_bytes()
    return out


def torch_scaler_text(scaler: Any, steps: int) -> str:
    """GradScaler's scale after `steps` steps, and how many it skipped: GradScaler keeps no
    count, but with fewer steps than its growth interval every halving was one skip."""
    scale = scaler.get_scale()
    if steps >= scaler.get_growth_interval():
        return f"scale {scale:g}"
    return f"scale {scale:g}, {round(math.log2(INIT_SCALE / scale))} skipped"


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def rss_text(base: int) -> str:
    return f"{rss_bytes() / MiB:.0f} MiB RSS (base {base / MiB:.0f})"


def measure(job: Job, lister: KernelLister | None = None) -> dict[str, Any]:
    """One row: ms/step per window, last loss and peak memory, or why there is none."""
    try:
        if job.device == "gpu":
            free_gpu_memory()
        if job.framework == "rustyflow":
            result = measure_rustyflow(job, lister)
        else:
            result = measure_pytorch(job)
        if not math.isfinite(result["loss"]):
            raise FloatingPointError(f"the loss is {result['loss']} after the timed steps")
    except NotAvailable as exc:
        return {"status": f"not available: {exc}"}
    except Exception as exc:  # a failed row must not lose the others
        traceback.print_exc()
        return {"status": f"failed: {type(exc).__name__}: {exc}"}
    return {"status": "ok", **result}


def measure_in_worker(job: Job) -> dict[str, Any]:
    """measure(job) in a fresh process, so ru_maxrss is this framework's peak alone."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker",
           json.dumps(dataclasses.asdict(job))]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": f"failed: worker exited with {proc.returncode}: {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- loss-curve agreement -----------------------------------------------------------------------
Batches = list[tuple[np.ndarray, np.ndarray]]


def curve_batches(shape: str, steps: int, data_dir: str | None) -> tuple[GPTConfig, Batches]:
    """The first `steps` WikiText-2 training batches in order (wrapping), shared by every
    precision and both frameworks."""
    corpus = data.load_corpus("wikitext-2", data_dir)
    cfg, batch = gpt_config(shape, len(corpus.vocab))
    stream = data.batchify(corpus.train.astype(np.int32), batch)
    n = data.num_batches(stream, cfg.seq_len)
    return cfg, [tuple(np.ascontiguousarray(a) for a in data.get_batch(stream, i % n, cfg.seq_len))
                 for i in range(steps)]


def loss_curves(device: str, shape: str, cfg: GPTConfig, batches: Batches,
                precision: str, threads: int) -> dict[str, Any]:
    """Train both from the same weights on the same batches with the same schedule at
    `precision` (PyTorch under autocast for bf16/fp16), and the worst relative gap."""
    ours, our_scaler = rustyflow_curve(device, cfg, batches,
                                       policy_of(precision, threads=threads))
    if device == "gpu":
        free_gpu_memory()
    theirs, their_scaler = pytorch_curve(device, cfg, batches, peer(precision))
    rel = [abs(a - b) / abs(b) if math.isfinite(a) and math.isfinite(b) else math.inf
           for a, b in zip(ours, theirs, strict=True)]  # a NaN loss never passes
    worst = int(np.argmax(rel))
    return {"shape": shape, "steps": len(batches), "precision": precision, "rustyflow": ours,
            "pytorch": theirs, "max_rel": rel[worst], "worst_step": worst + 1,
            "bound": CURVE_BOUNDS[precision], "scalers": (our_scaler, their_scaler)}


def rustyflow_curve(device: str, cfg: GPTConfig, batches: Batches,
                    policy: RunPolicy) -> tuple[list[float], str | None]:
    """RustyFlow's loss per step under `policy`, and its loss scaler's state after the run
    (fp16)."""
    backend = get_backend(device, policy)
    model, opt, scaler = rustyflow_training(cfg, backend, len(batches))
    step = rustyflow_step_fn(model, opt, "eager", scaler)
    losses = [host_float(backend, step(backend.from_host(x), backend.from_host(y)))
              for x, y in batches]
    if scaler is None:
        return losses, None
    state = scaler.state(backend.to_host)
    return losses, f"scale {state['scale']:g}, {state['skipped']} skipped"


def pytorch_curve(device: str, cfg: GPTConfig, batches: Batches,
                  precision: str) -> tuple[list[float], str | None]:
    """PyTorch's loss per step (each step's LR from RustyFlow's schedule in Python floats),
    and its GradScaler's state after the run (fp16; the loss is read every step anyway, so
    the skips are counted exactly)."""
    import torch
    from torch_gpt import cosine_lr

    set_torch_precision(device, precision)
    dev = "cuda" if device == "gpu" else "cpu"
    model, opt, scaler = torch_training(cfg, device, precision)
    step = pytorch_step_fn(model, opt, "eager", precision, scaler)
    losses, skipped = [], 0
    last = scaler.get_scale() if scaler is not None else 0.0
    for s, (x, y) in enumerate(batches, start=1):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(s, LR, WARMUP, len(batches), MIN_RATIO)
        xt, yt = (torch.from_numpy(a.astype(np.int64)).to(dev) for a in (x, y))
        losses.append(float(step(xt, yt).item()))
        if scaler is not None:
            scale = scaler.get_scale()
            skipped, last = skipped + (scale < last), scale
    return losses, None if scaler is None else f"scale {last:g}, {skipped} skipped"


def plot_curves(curves: list[dict[str, Any]], path: Path) -> str:
    """PNG of both loss curves, one panel per precision; says why not when matplotlib is
    missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot (matplotlib is not installed)"
    fig, axes = plt.subplots(1, len(curves), figsize=(7 * len(curves), 4), squeeze=False,
                             sharey=True)
    for ax, curve in zip(axes[0], curves, strict=True):
        steps = range(1, curve["steps"] + 1)
        ax.plot(steps, curve["pytorch"], label="PyTorch", linewidth=2)
        ax.plot(steps, curve["rustyflow"], label="RustyFlow", linestyle="--")
        ax.set(xlabel="step", ylabel="training loss", title=f"{curve['precision']}: max rel. "
               f"diff {curve['max_rel']:.2e} (bound {curve['bound']:.0%})")
        ax.legend()
    fig.suptitle(f"WikiText-2, {describe_shape(curves[0]['shape'])}, same initial weights")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot: `{path}`"


# ---- report --------------------------------------------------------------------------------------
def machine(device: str) -> str:
    if device == "gpu":
        return devices.gpu_description()
    blas, kernels = devices.blas_info(), backend.cpu_kernels(get_backend("cpu").kernels)
    return (f"{devices.cpu_name()} ({os.cpu_count()} cores, {blas['library']}); RustyFlow "
            f"eager: {kernels} kernels, numpy: CPU_JIT=off (NumPy kernels)")


def versions(device: str) -> str:
    import torch

    parts = [f"Python {platform.python_version()}", f"NumPy {np.__version__}",
             f"PyTorch {torch.__version__}"]
    if device == "gpu":
        import cupy

        parts.insert(2, f"CuPy {cupy.__version__}")
        if cudnn.available():
            parts.insert(3, f"cuDNN {cudnn.version()}")
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or "unknown"
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return ", ".join(parts) + f"; RustyFlow {commit}{' + local changes' if dirty else ''}"


def render(args: argparse.Namespace, rows: list[tuple[Job, dict[str, Any]]],
           curves: list[dict[str, Any] | str], plot_note: str,
           gpu_name: str | None = None) -> str:
    """The markdown report. `gpu_name` (the GPU's name, None on the CPU) selects the peak
    the MFU column is counted against; no column without one."""
    threads = args.threads or os.cpu_count()
    compiled = any(j.mode == "compile" for j, _ in rows)
    peaks = ({p: mfu.peak_for(gpu_name, p) for p in dict.fromkeys(j.precision for j, _ in rows)}
             if gpu_name is not None else {})
    with_mfu = any(peaks.values())
    vocabs = ", ".join(f"{s} {gpt_config(s)[0].vocab_size:,}"
                       for s in dict.fromkeys(j.shape for j, _ in rows))
    lines = [
        f"# RustyFlow vs PyTorch — {args.device.upper()}",
        "",
        f"- Command: `python {shlex.join(sys.argv)}`",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- Machine: {machine(args.device)}"
        + (f"; {threads} threads for both frameworks" if args.device == "cpu" else ""),
        f"- Versions: {versions(args.device)}",
        "- Step: zero grad, forward, backward, grad-norm clip 1.0, AdamW (PyTorch: fused); "
        f"same initial weights (`init_weights(cfg, {SEED})`), random tokens; vocabulary: "
        f"{vocabs or VOCAB}",
        *precision_notes(set(args.precisions) | set(args.curve_precisions)),
        *([compile_note(rows)] if compiled else []),
        *([mfu.describe(peaks, gpu_name)] if peaks and gpu_name is not None else []),
        "- ms/step: median of the timed windows (min–max in brackets), after warm-up, device "
        "synchronised before each clock read; ratio = ms/step ÷ PyTorch eager's"
        + (" (or the fastest compile row's)" if compiled else "") + " at the same shape and "
        "precision (lower is better for RustyFlow); peak memory: the same ratios",
        "",
        "| shape | precision | framework/mode | ms/step | tokens/s | "
        + ("MFU | " if with_mfu else "") + "ratio vs PyTorch eager "
        + ("| ratio vs PyTorch compile " if compiled else "") + "| peak mem |",
        "|---|---|---|---:|---:|" + ("---:|" if with_mfu else "") + "---:|"
        + ("---:|" if compiled else "") + "---|",
    ]
    refs = [reference(rows, "eager")] + ([reference(rows, "compile")] if compiled else [])
    for job, res in rows:
        lines.append(table_row(job, res, refs, peaks.get(job.precision) if with_mfu else None,
                               with_mfu))
    if rows:
        counts = dict.fromkeys((j.shape, j.warmup, j.steps, j.windows) for j, _ in rows)
        lines += ["", "Warm-up / timed steps / windows: " + "; ".join(
            f"{s} {w} / {n} / {k}" for s, w, n, k in counts) + "."]
    lines += fp8_lines(rows)
    scaled = [f"{describe_shape(j.shape)} {j.label()}: {r['scaler']}"
              for j, r in rows if r.get("scaler")]
    if scaled:
        lines += ["", f"fp16 loss scale after the timed steps (initial {INIT_SCALE:g}): "
                  + "; ".join(scaled) + "."]
    return "\n".join(lines + ["", "## Loss-curve agreement", "",
                              *render_curves(curves, plot_note)]) + "\n"


Reference = tuple[dict[tuple[str, str], float], dict[tuple[str, str], Any]]


def table_row(job: Job, res: dict[str, Any], refs: list[Reference], peak: mfu.Peak | None,
              with_mfu: bool) -> str:
    """One row: ms/step, tokens/s, MFU (against `peak`; "—" without one), the ratios against
    each reference (eager, then compile) and the peak memory against the same references."""
    head = f"| {describe_shape(job.shape)} | {job.precision} | {job.label()} |"
    if res["status"] != "ok":
        blanks = " — |" * (2 + with_mfu + len(refs))
        return f"{head}{blanks} {res['status']} |"
    t = res["times"]
    ms = statistics.median(t) * 1e3
    cfg, batch = gpt_config(job.shape)
    key = (job.shape, peer(job.precision))
    ratios = [f"{ms / (times[key] * 1e3):.2f}" if key in times else "—" for times, _ in refs]
    names = ("PyTorch eager", "compile")
    mem_ratios = [f"{res['peak_bytes'] / mem[key]:.2f}x {name}"
                  for (_, mem), name in zip(refs, names, strict=False)
                  if mem.get(key) and res.get("peak_bytes")]
    mem = res["memory"] + (f" ({', '.join(mem_ratios)})" if mem_ratios else "")
    util = ([f"{mfu.mfu(cfg, batch, ms / 1e3, peak):.1%}" if peak is not None else "—"]
            if with_mfu else [])
    return (f"{head} {ms:.1f} ({min(t) * 1e3:.1f}–{max(t) * 1e3:.1f}) | "
            f"{batch * cfg.seq_len / (ms / 1e3):,.0f} | " + "".join(f"{u} | " for u in util)
            + f"{' | '.join(ratios)} | {mem} |")


def fp8_lines(rows: list[tuple[Job, dict[str, Any]]]) -> list[str]:
    """Each fp8 row's speed-up over RustyFlow's bf16 row of the same shape and mode (bf16's
    step time over fp8's: above 1 is faster)."""
    ok = {(j.shape, j.precision, j.label()): statistics.median(r["times"])
          for j, r in rows if j.framework == "rustyflow" and r["status"] == "ok"}
    out = [f"{describe_shape(shape)} {label}: {precision} {ok[(shape, 'bf16', label)] / t:.3f}x "
           f"bf16's tokens/s" for (shape, precision, label), t in ok.items()
           if precision.startswith("fp8") and (shape, "bf16", label) in ok]
    return ["", "fp8 against RustyFlow's bf16 (same shape and mode, one process): "
            + "; ".join(out) + "."] if out else []


def compile_note(rows: list[tuple[Job, dict[str, Any]]]) -> str:
    """The header line saying what the compile rows compile."""
    modes = ", ".join(dict.fromkeys(f"`{j.compile_mode}`" for j, _ in rows if j.mode == "compile"))
    return ("- PyTorch compile: `torch.compile(model, mode=...)` of the model (forward, loss and "
            f"so its backward; modes {modes}; `default` is nanoGPT's plain "
            "`torch.compile(model)`), grad clip and fused AdamW eager, as in nanoGPT's train.py; "
            "at least 3 warm-up steps")


def precision_notes(names: set[str]) -> list[str]:
    """Header lines saying what each precision in the run means in each framework."""
    notes = []
    if "tf32" in names:
        notes.append("- tf32: RustyFlow PRECISION=tf32 (cuBLAS TF32 compute for fp32 GEMMs); "
                     "PyTorch `set_float32_matmul_precision(\"high\")`")
    if names & {"bf16", "fp16"}:
        tf32 = "TF32 allowed" if AUTOCAST_MATMUL == "high" else "no TF32"
        notes.append(
            "- bf16/fp16: RustyFlow `Precision.of(...)`: fp32 master weights, gradients and "
            "AdamW state, forward and backward on a 16-bit copy of the weights, GEMMs "
            "accumulating in fp32; fp16 adds dynamic loss scaling (`LossScaler`: 2^16, x2 "
            "per 2000 clean steps, x0.5 and skip on overflow). PyTorch: fp32 model, forward + "
            "loss under `torch.autocast(\"cuda\", dtype=bfloat16/float16)` (its op lists keep "
            "embeddings, the residual stream, LayerNorm and the loss in fp32), backward "
            "outside it; fp16 with `torch.amp.GradScaler(\"cuda\")` (same scale rules), "
            "`unscale_` before the clip; fp32 matmul mode under autocast: "
            f"`set_float32_matmul_precision(\"{AUTOCAST_MATMUL}\")` ({tf32}, as in the "
            "tf32 rows; autocast runs every GEMM of this model in 16 bits)")
    if "fp8" in names:
        notes.append(
            "- fp8: RustyFlow `Precision.of(\"fp8\")`: bf16 with every GEMM of a Linear layer "
            "and of the tied LM head on FP8 tensor cores (cuBLASLt; e4m3 activations and "
            "weights, e5m2 gradients, per-tensor current scaling, fp32 accumulation); "
            "attention stays bf16. Its ratios and loss curve are against PyTorch's bf16 rows "
            "(PyTorch has no FP8 training of its own), its MFU against the bf16 peak")
    if "fp8-delayed" in names:
        notes.append(
            "- fp8-delayed: fp8 with FP8_SCALING=delayed: in the replayed graph each cast is "
            "scaled by the amax its tensor had in the step before (taken while casting), with "
            "no amax pass; held to the same rows, peak and bound as fp8")
    return notes


def reference(rows: list[tuple[Job, dict[str, Any]]], mode: str) -> Reference:
    """PyTorch `mode`'s median step time and peak bytes per (shape, precision); of several
    rows (compile modes), the fastest's."""
    times: dict[tuple[str, str], float] = {}
    memory: dict[tuple[str, str], Any] = {}
    for j, r in rows:
        if j.framework != "pytorch" or j.mode != mode or r["status"] != "ok":
            continue
        key, median = (j.shape, j.precision), statistics.median(r["times"])
        if key not in times or median < times[key]:
            times[key], memory[key] = median, r.get("peak_bytes")
    return times, memory


def render_curves(curves: list[dict[str, Any] | str], plot_note: str) -> list[str]:
    """One table row per precision: the worst relative gap, where, its bound, and the finals."""
    done = [c for c in curves if isinstance(c, dict)]
    if not done:
        return [str(c) for c in curves] or ["not run (--curve-steps 0)"]
    first = done[0]
    lines = [
        f"{describe_shape(first['shape'])}, {first['steps']} steps on WikiText-2 train "
        f"batches, LR {LR} (warm-up {WARMUP}, cosine to {MIN_RATIO:.0%}), same weights and "
        "batches in both frameworks, PyTorch under autocast for bf16/fp16; max rel. diff = "
        f"max over steps of |l_rf − l_pt| / |l_pt|; {plot_note}.",
        "",
        "| precision | max rel. diff (step) | bound | within bound | final loss RustyFlow "
        "| final loss PyTorch | fp16 loss scale RustyFlow / PyTorch |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for c in curves:
        if isinstance(c, str):
            lines.append(f"| {c} | | | | | | |")
            continue
        ok = "yes" if c["max_rel"] <= c["bound"] else "**no**"
        ours, theirs = c["scalers"]
        scale = f"{ours} / {theirs}" if ours or theirs else "—"
        lines.append(
            f"| {c['precision']} | {c['max_rel']:.2e} (step {c['worst_step']}) | "
            f"{c['bound']:.0e} ({c['bound']:.0%}) | {ok} | {c['rustyflow'][-1]:.4f} | "
            f"{c['pytorch'][-1]:.4f} | {scale} |")
    return lines


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda f: f.write(text.encode()))


# ---- command line --------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--shapes", help="comma-separated: seed,small,medium,gpt2-b16,gpt2-b32 "
                   "(the gpt2 shapes are GPU-only; cpu default: seed,small; gpu: seed,small,"
                   "medium)")
    p.add_argument("--precisions", help="comma-separated: fp32,tf32,bf16,fp16,fp8,fp8-delayed "
                   "(all but fp32 GPU-only; fp8 and fp8-delayed (FP8_SCALING=delayed) with "
                   "bf16 beside them; cpu default: fp32; gpu: the first four)")
    p.add_argument("--steps", type=int, help="timed steps per run (default per shape)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default per shape)")
    p.add_argument("--windows", type=int, default=5, help="timed windows (median reported)")
    p.add_argument("--skip-eager", action="store_true", help="GPU: RustyFlow's graph rows "
                   "only (PyTorch eager stays, the ratios' reference)")
    p.add_argument("--attention", default="auto", help="comma-separated ATTENTION values for "
                   "RustyFlow's rows, each a row of its own: auto, own, cudnn, materialized")
    p.add_argument("--head-chunk", default="0", help="comma-separated LM_HEAD_CHUNK values "
                   "for RustyFlow's rows (0: the whole head at once)")
    p.add_argument("--adam-state", default="fp32", help="comma-separated ADAM_STATE_DTYPE "
                   "values for RustyFlow's rows: fp32, bf16 (GPU)")
    p.add_argument("--curve-steps", type=int, default=200, help="0 skips the loss curves")
    bounds = ", ".join(f"{k} {v * 100:g}%%" for k, v in CURVE_BOUNDS.items())  # %% for argparse
    p.add_argument("--curve-precisions", help=f"comma-separated: fp32,bf16,fp16 (bounds: "
                   f"{bounds}; bf16 and fp16 are GPU-only; cpu default: fp32; gpu: fp32,bf16)")
    p.add_argument("--curve-shape", default="seed", choices=tuple(SHAPES))
    p.add_argument("--data-dir", help="folder holding wikitext-2/ (default: "
                   "$RUSTYFLOW_DATA_DIR, ./data, else download)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for both (0 = all)")
    compile_flag = p.add_mutually_exclusive_group()
    compile_flag.add_argument("--skip-compile", dest="compile", action="store_false",
                              help="no torch.compile rows (the CPU default)")
    compile_flag.add_argument("--compile", dest="compile", action="store_true",
                              help="torch.compile rows (the GPU default)")
    p.set_defaults(compile=None)
    p.add_argument("--compile-modes", help="comma-separated torch.compile modes for the "
                   f"compile rows: {', '.join(COMPILE_MODES)} (default: reduce-overhead; "
                   "default at the gpt2 shapes, as nanoGPT compiles)")
    p.add_argument("--kernel-list", type=Path, help="GPU: write every kernel of each "
                   "rustyflow graph row's replayed step here (markdown, CUPTI records of "
                   "sampled replays after the timed ones)")
    p.add_argument("--kernel-samples", type=int, default=20,
                   help="sampled replays per kernel list (default 20)")
    p.add_argument("--out", type=Path, help="also write the markdown here (atomically)")
    p.add_argument("--plot", type=Path, help="loss-curve PNG (default: next to --out)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    gpu = args.device == "gpu"
    args.shapes = (args.shapes or ("seed,small,medium" if gpu else "seed,small")).split(",")
    args.precisions = (args.precisions or (",".join(GPU_DEFAULT) if gpu else "fp32")).split(",")
    args.curve_precisions = (args.curve_precisions
                             or ("fp32,bf16" if gpu else "fp32")).split(",")
    if args.compile is None:
        args.compile = gpu
    for name in args.shapes:
        if name not in SHAPES:
            p.error(f"unknown shape {name!r}: expected {', '.join(SHAPES)}")
        if name in GPU_SHAPES and not gpu:
            p.error(f"--shapes: {name} is GPU-only (use --device gpu): a CPU takes minutes a "
                    "step at GPT-2's size")
    args.attention = args.attention.split(",")
    for name in args.attention:
        if name not in ("auto", "own", "cudnn", "materialized"):
            p.error(f"--attention: unknown value {name!r}: expected auto, own, cudnn or "
                    "materialized")
    try:
        args.head_chunk = [int(x) for x in args.head_chunk.split(",")]
    except ValueError:
        p.error(f"--head-chunk: expected comma-separated integers, got {args.head_chunk!r}")
    if min(args.head_chunk) < 0:
        p.error("--head-chunk: rows a chunk are 0 (the whole head) or more")
    args.adam_state = args.adam_state.split(",")
    if not set(args.adam_state) <= {"fp32", "bf16"} or ("bf16" in args.adam_state and not gpu):
        p.error(f"--adam-state: fp32, or bf16 on the GPU, not {','.join(args.adam_state)}")
    args.compile_modes = args.compile_modes.split(",") if args.compile_modes else None
    for name in args.compile_modes or ():
        if name not in COMPILE_MODES:
            p.error(f"--compile-modes: unknown mode {name!r}: expected "
                    f"{', '.join(COMPILE_MODES)}")
    if args.compile_modes and not args.compile:
        p.error("--compile-modes needs the compile rows: drop --skip-compile (or add "
                "--compile on the CPU)")
    if args.skip_eager and not gpu:
        p.error("--skip-eager leaves the graph rows, which need --device gpu")
    if args.kernel_list is not None and not gpu:
        p.error("--kernel-list lists the kernels of a replayed CUDA graph: use --device gpu")
    if args.kernel_samples < 1:
        p.error(f"--kernel-samples must be at least 1, got {args.kernel_samples}")
    for flag, names, known in (("--precisions", args.precisions, PRECISIONS),
                               ("--curve-precisions", args.curve_precisions, CURVE_BOUNDS)):
        for name in names:
            if name not in known:
                p.error(f"{flag}: unknown precision {name!r}: expected {', '.join(known)}")
            if name in GPU_ONLY and not gpu:
                p.error(f"{flag}: {name} is GPU-only (use --device gpu); the CPU runs fp32")
    for name in args.precisions:
        if name in mfu.PEER and mfu.PEER[name] not in args.precisions:
            p.error(f"--precisions: {name}'s rows are held to {mfu.PEER[name]}'s (PyTorch has no "
                    f"{name} training of its own): add {mfu.PEER[name]}, e.g. --precisions "
                    f"{mfu.PEER[name]},{name}")
    if args.plot is None and args.out is not None:
        args.plot = args.out.with_suffix(".png")
    return args


def plan(args: argparse.Namespace) -> list[Job]:
    modes = ([] if args.skip_eager else [("rustyflow", "eager")]) + (
        [("rustyflow", "graph")] if args.device == "gpu" else [])
    if args.device == "cpu" and get_backend("cpu").kernels.jit is not None:
        modes.append(("rustyflow", "numpy"))  # the pure-NumPy path too, for comparison
    modes.append(("pytorch", "eager"))
    jobs = []
    for shape in args.shapes:
        warmup, steps = DEFAULT_STEPS[args.device][shape]
        steps = args.steps if args.steps is not None else steps
        warmup = args.warmup if args.warmup is not None else warmup
        compiles = [("pytorch", "compile", m) for m in compile_modes(args, shape)]
        for precision in args.precisions:  # PyTorch's rows of fp8 are its peer's (bf16)
            jobs += [Job(args.device, shape, precision, fw, mode, warmup, steps,
                         max(1, min(args.windows, steps)), args.threads, compile_mode,
                         attention, chunk, state)
                     for fw, mode, compile_mode in [(*m, "") for m in modes] + compiles
                     if fw == "rustyflow" or peer(precision) == precision
                     for attention in (args.attention if fw == "rustyflow" else ["auto"])
                     for chunk in (args.head_chunk if fw == "rustyflow" else [0])
                     for state in (args.adam_state if fw == "rustyflow" else ["fp32"])]
    return jobs


def compile_modes(args: argparse.Namespace, shape: str) -> list[str]:
    """The torch.compile modes timed at `shape`: --compile-modes, else reduce-overhead (the
    older shapes' reference) or nanoGPT's default (the GPT-2 shapes); none without compile."""
    if not args.compile:
        return []
    return args.compile_modes or (["default"] if shape in GPU_SHAPES else ["reduce-overhead"])


def run_curves(args: argparse.Namespace) -> list[dict[str, Any] | str]:
    """The loss curves at each --curve-precisions precision: a result, or the reason there
    is none (a failed precision must not lose the others, nor the timing table)."""
    if args.device == "cpu":
        import torch

        torch.set_num_threads(RunPolicy(threads=args.threads).cpu_threads)
    try:
        cfg, batches = curve_batches(args.curve_shape, args.curve_steps, args.data_dir)
    except data.DataError as exc:
        return [f"not run: {exc}"]
    curves: list[dict[str, Any] | str] = []
    for precision in args.curve_precisions:
        print(f"[vs_pytorch] loss curves: {precision}, {args.curve_steps} steps ...",
              file=sys.stderr, flush=True)
        if args.device == "gpu":
            free_gpu_memory()
        try:
            curves.append(loss_curves(args.device, args.curve_shape, cfg, batches, precision,
                                      args.threads))
        except NotAvailable as exc:
            curves.append(f"{precision}: not available: {exc}")
        except Exception as exc:
            traceback.print_exc()
            curves.append(f"{precision}: failed: {type(exc).__name__}: {exc}")
    return curves


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(measure(Job(**json.loads(args.worker)))))
        return 0
    if args.device == "gpu" and (reason := gpu_unavailable_reason()):
        print(f"error: --device gpu: {reason}", file=sys.stderr)
        return 2
    lister = KernelLister(args.kernel_samples) if args.kernel_list is not None else None
    rows = []
    for job in plan(args):
        print(f"[vs_pytorch] {describe_shape(job.shape)} {job.precision} {job.label()} ...",
              file=sys.stderr, flush=True)
        result = measure(job, lister) if args.device == "gpu" else measure_in_worker(job)
        print(f"[vs_pytorch]   {result['status']}"
              + (f", {statistics.median(result['times']) * 1e3:.1f} ms/step"
                 if result["status"] == "ok" else ""), file=sys.stderr, flush=True)
        rows.append((job, result))
    curves = run_curves(args) if args.curve_steps > 0 else []
    done = [c for c in curves if isinstance(c, dict)]
    plot_note = ("" if not done else plot_curves(done, args.plot) if args.plot
                 else "no plot (no --plot)")
    gpu_name = get_backend("gpu").hardware() if args.device == "gpu" else None
    text = render(args, rows, curves, plot_note, gpu_name)
    print(text)
    if args.out:
        write_atomic(args.out, text)
    if lister is not None:
        write_atomic(args.kernel_list, kernel_report(args, rows, lister))
        print(f"[vs_pytorch] kernel list: {args.kernel_list}", file=sys.stderr)
    return 0


def kernel_report(args: argparse.Namespace, rows: list[tuple[Job, dict[str, Any]]],
                  lister: KernelLister) -> str:
    """The --kernel-list file: each graph row's kernels, or why a row has none."""
    lines = ["# Kernels of rustyflow's replayed training step", "",
             f"- Command: `python {shlex.join(sys.argv)}`",
             f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
             f"- Machine: {machine(args.device)}", f"- Versions: {versions(args.device)}",
             "- Times: CUPTI kernel records of sampled replays of the captured step, taken after "
             "the timed steps (the graph profile of `rustyflow train --profile-mode graph`); "
             "each kernel attributed to the ops that launched it", ""]
    for job, res in rows:
        if job.mode != "graph":
            continue
        if res.get("kernels"):
            lines += res["kernels"]
        else:
            why = lister.unavailable or res["status"]
            lines += [f"## {describe_shape(job.shape)}, {job.precision}, {job.label()}", "",
                      f"No kernel list: {why}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
