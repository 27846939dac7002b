"""RustyFlow vs PyTorch on one device: step time, throughput, peak memory, loss-curve agreement.

Both frameworks train the same GPT from the same initial weights (`init_weights(cfg, SEED)`)
with the same step: zero grad, forward, backward, clip the global grad norm to 1.0, AdamW.
For every shape and precision it times RustyFlow (eager, and CUDA-graph replay on the GPU; on the
CPU also eager with CPU_JIT=off, the pure-NumPy kernels, when numba is installed) and
PyTorch (eager, and torch.compile mode="reduce-overhead" by default on the GPU), then trains
both for --curve-steps steps on WikiText-2 and reports how far the loss curves drift apart.
On the CPU each timing runs in a worker process of its own, so the peak RSS it reports is that
framework's alone; on the GPU everything runs in this process, memory freed between runs.

    python benchmarks/vs_pytorch.py --device cpu --out benchmarks/results/cpu-<machine>.md
    python benchmarks/vs_pytorch.py --device gpu --out benchmarks/results/<gpu>.md
"""

from __future__ import annotations

import argparse
import dataclasses
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
import tempfile
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
from rustyflow_py.engine.backend import get_backend, gpu_unavailable_reason  # noqa: E402
from rustyflow_py.engine.memory import PeakMemory  # noqa: E402
from rustyflow_py.engine.precision import Precision  # noqa: E402
from rustyflow_py.engine.tensor import Tensor  # noqa: E402
from rustyflow_py.model.gpt import GPT, GPTConfig, init_weights  # noqa: E402
from rustyflow_py.model.optim import AdamW, Schedule  # noqa: E402

SHAPES = {  # the benchmark shapes: layers, heads, embed, seq_len, batch
    "seed": (2, 4, 128, 64, 16),
    "small": (6, 6, 384, 256, 32),
    "medium": (12, 12, 768, 512, 16),
}
VOCAB = 33278  # WikiText-2's
SEED = 1337
LR, WARMUP, MIN_RATIO, CLIP = 1e-3, 100, 0.1, 1.0  # config.env's defaults
DEFAULT_STEPS = {  # (warm-up, timed) steps per shape: a 2-core CPU takes ~10 s a small step
    "cpu": {"seed": (3, 10), "small": (2, 5), "medium": (1, 3)},
    "gpu": {"seed": (10, 50), "small": (10, 40), "medium": (5, 20)},
}
MiB, GiB = 2**20, 2**30

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


def gpt_config(shape: str, vocab: int = VOCAB) -> tuple[GPTConfig, int]:
    layers, heads, embed, seq_len, batch = SHAPES[shape]
    return GPTConfig(vocab, seq_len, layers, heads, embed), batch


def describe_shape(shape: str) -> str:
    layers, heads, embed, seq_len, batch = SHAPES[shape]
    return f"{shape} (L{layers} H{heads} E{embed} T{seq_len} B{batch})"


def synthetic_batch(cfg: GPTConfig, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Uniform random tokens: timing does not depend on the text, only on the shapes."""
    rng = np.random.default_rng(SEED)
    tokens = rng.integers(0, cfg.vocab_size, size=(batch, cfg.seq_len + 1), dtype=np.int32)
    return np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])


# ---- HOOK: the RustyFlow training step that is timed ---------------------------------------------
def rustyflow_step_fn(model: GPT, optimizer: AdamW, mode: str) -> StepFn:
    """RustyFlow's training step from its public API, as Trainer.step runs it.

    "eager" runs zero_grad -> forward -> backward -> optimizer.step (clip + AdamW) each call.
    "graph" captures that same step once as a CUDA graph (rustyflow_py.engine.graph.CapturedStep)
    and replays it; NotAvailable when this tree has no graph support or the capture fails.
    """

    def eager(x: Any, y: Any) -> Any:
        model.buffer.zero_grad()
        loss = model(Tensor(x), Tensor(y))
        loss.backward()
        optimizer.step()
        return loss.data

    if mode in ("eager", "numpy"):
        return eager
    if mode != "graph":
        raise ValueError(f"unknown RustyFlow mode {mode!r}")
    if model.device != "gpu":
        raise NotAvailable("CUDA graphs need the GPU")
    return GraphStep(eager, model.buffer.backend)


class GraphStep:
    """The eager step recorded once as a CUDA graph on static batch buffers, then replayed."""

    def __init__(self, eager: StepFn, backend: Any) -> None:
        try:
            from rustyflow_py.engine.graph import CapturedStep, GraphCaptureError
        except ImportError as exc:
            raise NotAvailable(f"no graph support in this tree ({exc})") from None
        self.eager, self.backend = eager, backend
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
                    self.captured.capture()
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


def pytorch_step_fn(model: Any, optimizer: Any, mode: str) -> StepFn:
    """The same step in PyTorch; "compile" compiles the model (forward + backward) with
    mode="reduce-overhead" (CUDA graphs on the GPU), the clip and fused AdamW stay eager."""
    import torch

    params = list(model.parameters())
    forward = model
    if mode == "compile":
        torch._dynamo.reset()
        forward = torch.compile(model, mode="reduce-overhead")
    elif mode != "eager":
        raise ValueError(f"unknown PyTorch mode {mode!r}")

    def step(x: Any, y: Any) -> Any:
        if mode == "compile":
            torch.compiler.cudagraph_mark_step_begin()
        optimizer.zero_grad(set_to_none=True)
        loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()
        return loss

    return step


def torch_model(cfg: GPTConfig, device: str) -> tuple[Any, Any]:
    """The PyTorch reference with RustyFlow's initial weights, and its AdamW."""
    import torch
    from torch_gpt import TorchGPT, make_adamw

    model = TorchGPT(cfg.vocab_size, cfg.seq_len, cfg.n_layer, cfg.n_head, cfg.n_embd)
    model.load_from_rustyflow(init_weights(cfg, SEED))
    model.to(torch.device("cuda" if device == "gpu" else "cpu"))
    return model, make_adamw(model, LR, fused=True)


def set_torch_precision(device: str, precision: str) -> None:
    import torch

    torch.set_float32_matmul_precision("high" if device == "gpu" and precision == "tf32"
                                       else "highest")


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


def measure_rustyflow(job: Job) -> dict[str, Any]:
    backend = get_backend(job.device)
    backend.set_precision(Precision.of(job.precision))
    if job.device == "cpu":
        backend.set_threads(job.threads)
        backend.kernels.set_jit("off" if job.mode == "numpy" else "auto")
    base = rss_bytes()
    cfg, batch = gpt_config(job.shape)
    x, y = (backend.from_host(a) for a in synthetic_batch(cfg, batch))
    model = GPT(cfg, job.device, SEED)  # initialised with init_weights(cfg, SEED)
    opt = AdamW(model.buffer, Schedule(LR, WARMUP, 10**6, MIN_RATIO), grad_clip=CLIP)
    step = rustyflow_step_fn(model, opt, job.mode)
    times, loss = time_steps(step, x, y, job, backend.synchronize)
    out: dict[str, Any] = {"times": times, "loss": float(backend.to_host(loss))}
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
    model, opt = torch_model(cfg, job.device)
    step = pytorch_step_fn(model, opt, job.mode)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    warm = dataclasses.replace(job, warmup=max(job.warmup, 3)) if job.mode == "compile" else job
    times, loss = time_steps(step, x, y, warm, sync)
    out: dict[str, Any] = {"times": times, "loss": float(loss.item())}
    if cuda:
        out["memory"] = (f"{torch.cuda.max_memory_allocated() / GiB:.2f} GiB allocated, "
                         f"{torch.cuda.max_memory_reserved() / GiB:.2f} reserved")
        out["peak_bytes"] = torch.cuda.max_memory_allocated()
    else:
        out["memory"], out["peak_bytes"] = rss_text(base), rss_bytes()
    return out


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def rss_text(base: int) -> str:
    return f"{rss_bytes() / MiB:.0f} MiB RSS (base {base / MiB:.0f})"


def measure(job: Job) -> dict[str, Any]:
    """One row: ms/step per window, last loss and peak memory, or why there is none."""
    try:
        if job.device == "gpu":
            free_gpu_memory()
        run = measure_rustyflow if job.framework == "rustyflow" else measure_pytorch
        result = run(job)
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
def loss_curves(device: str, shape: str, steps: int, data_dir: str | None) -> dict[str, Any]:
    """Train both from the same weights on the same WikiText-2 batches, fp32, same schedule."""
    import torch
    from torch_gpt import cosine_lr

    corpus = data.load_corpus("wikitext-2", data_dir)
    cfg, batch = gpt_config(shape, len(corpus.vocab))
    stream = data.batchify(corpus.train.astype(np.int32), batch)
    n = data.num_batches(stream, cfg.seq_len)
    batches = [tuple(np.ascontiguousarray(a) for a in data.get_batch(stream, i % n, cfg.seq_len))
               for i in range(steps)]

    backend = get_backend(device)
    backend.set_precision(Precision.of("fp32"))
    model = GPT(cfg, device, SEED)
    opt = AdamW(model.buffer, Schedule(LR, WARMUP, steps, MIN_RATIO), grad_clip=CLIP)
    step = rustyflow_step_fn(model, opt, "eager")
    ours = [float(backend.to_host(step(backend.from_host(x), backend.from_host(y))))
            for x, y in batches]
    del model, opt, step

    set_torch_precision(device, "fp32")
    dev = "cuda" if device == "gpu" else "cpu"
    ref, ref_opt = torch_model(cfg, device)
    ref_step = pytorch_step_fn(ref, ref_opt, "eager")
    theirs = []
    for s, (x, y) in enumerate(batches, start=1):
        for group in ref_opt.param_groups:
            group["lr"] = cosine_lr(s, LR, WARMUP, steps, MIN_RATIO)
        xt, yt = (torch.from_numpy(a.astype(np.int64)).to(dev) for a in (x, y))
        theirs.append(float(ref_step(xt, yt).item()))

    rel = [abs(a - b) / abs(b) for a, b in zip(ours, theirs, strict=True)]
    worst = int(np.argmax(rel))
    return {"shape": shape, "steps": steps, "rustyflow": ours, "pytorch": theirs,
            "max_rel": rel[worst], "worst_step": worst + 1}


def plot_curves(curve: dict[str, Any], path: Path) -> str:
    """PNG of both loss curves; says why not when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot (matplotlib is not installed)"
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = range(1, curve["steps"] + 1)
    ax.plot(steps, curve["pytorch"], label="PyTorch", linewidth=2)
    ax.plot(steps, curve["rustyflow"], label="RustyFlow", linestyle="--")
    ax.set(xlabel="step", ylabel="training loss",
           title=f"WikiText-2, {describe_shape(curve['shape'])}, same initial weights")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot: `{path}`"


# ---- report --------------------------------------------------------------------------------------
def machine(device: str) -> str:
    if device == "gpu":
        return devices.gpu_description()
    blas = devices.blas_info()
    return (f"{devices.cpu_name()} ({os.cpu_count()} cores, {blas['library']}); RustyFlow "
            f"eager: {backend.cpu_kernels()} kernels, numpy: CPU_JIT=off (NumPy kernels)")


def versions(device: str) -> str:
    import torch

    parts = [f"Python {platform.python_version()}", f"NumPy {np.__version__}",
             f"PyTorch {torch.__version__}"]
    if device == "gpu":
        import cupy

        parts.insert(2, f"CuPy {cupy.__version__}")
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or "unknown"
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return ", ".join(parts) + f"; RustyFlow {commit}{' + local changes' if dirty else ''}"


def render(args: argparse.Namespace, rows: list[tuple[Job, dict[str, Any]]],
           curve: dict[str, Any] | str | None, plot_note: str) -> str:
    threads = args.threads or os.cpu_count()
    lines = [
        f"# RustyFlow vs PyTorch — {args.device.upper()}",
        "",
        f"- Command: `python {shlex.join(sys.argv)}`",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- Machine: {machine(args.device)}"
        + (f"; {threads} threads for both frameworks" if args.device == "cpu" else ""),
        f"- Versions: {versions(args.device)}",
        "- Step: zero grad, forward, backward, grad-norm clip 1.0, AdamW (PyTorch: fused); "
        f"same initial weights (`init_weights(cfg, {SEED})`), random tokens, vocabulary {VOCAB}",
        "- ms/step: median of the timed windows (min–max in brackets), after warm-up, device "
        "synchronised before each clock read; ratio = ms/step ÷ PyTorch eager's (lower is "
        "better for RustyFlow)",
        "",
        "| shape | precision | framework/mode | ms/step | tokens/s | ratio vs PyTorch eager "
        "| peak mem |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    eager = {(j.shape, j.precision): statistics.median(r["times"]) for j, r in rows
             if j.framework == "pytorch" and j.mode == "eager" and r["status"] == "ok"}
    eager_mem = {(j.shape, j.precision): r.get("peak_bytes") for j, r in rows
                 if j.framework == "pytorch" and j.mode == "eager" and r["status"] == "ok"}
    for job, res in rows:
        head = f"| {describe_shape(job.shape)} | {job.precision} | {job.framework} {job.mode} |"
        if res["status"] != "ok":
            lines.append(f"{head} — | — | — | {res['status']} |")
            continue
        t = res["times"]
        ms = statistics.median(t) * 1e3
        cfg, batch = gpt_config(job.shape)
        ref = eager.get((job.shape, job.precision))
        ratio = f"{ms / (ref * 1e3):.2f}" if ref else "—"
        mem_ref = eager_mem.get((job.shape, job.precision))
        mem = res["memory"] + (f" ({res['peak_bytes'] / mem_ref:.2f}x PyTorch eager)"
                               if mem_ref and res.get("peak_bytes") else "")
        lines.append(f"{head} {ms:.1f} ({min(t) * 1e3:.1f}–{max(t) * 1e3:.1f}) | "
                     f"{batch * cfg.seq_len / (ms / 1e3):,.0f} | {ratio} | {mem} |")
    if rows:
        counts = dict.fromkeys((j.shape, j.warmup, j.steps, j.windows) for j, _ in rows)
        lines += ["", "Warm-up / timed steps / windows: " + "; ".join(
            f"{s} {w} / {n} / {k}" for s, w, n, k in counts) + "."]
    lines += ["", "## Loss-curve agreement", ""]
    if isinstance(curve, dict):
        rf, pt = curve["rustyflow"][-1], curve["pytorch"][-1]
        ok = "yes" if curve["max_rel"] <= 0.01 else "**no**"
        lines.append(
            f"{describe_shape(curve['shape'])}, {curve['steps']} steps on WikiText-2 train "
            f"batches, fp32, LR {LR} (warm-up {WARMUP}, cosine to {MIN_RATIO:.0%}), same "
            f"weights and batches: max |l_rf − l_pt| / |l_pt| = {curve['max_rel']:.2e} "
            f"(step {curve['worst_step']}); final loss RustyFlow {rf:.4f}, PyTorch {pt:.4f}; "
            f"within 1 %: {ok}; {plot_note}.")
    else:
        lines.append(curve or "not run (--curve-steps 0)")
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        f.write(text)
    os.replace(f.name, path)


# ---- command line --------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--shapes", help="comma-separated: seed,small,medium (cpu default: "
                   "seed,small; gpu: all three)")
    p.add_argument("--precisions", help="fp32,tf32 (tf32 is GPU-only; gpu default: both)")
    p.add_argument("--steps", type=int, help="timed steps per run (default per shape)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default per shape)")
    p.add_argument("--windows", type=int, default=5, help="timed windows (median reported)")
    p.add_argument("--curve-steps", type=int, default=200, help="0 skips the loss curves")
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
    p.add_argument("--out", type=Path, help="also write the markdown here (atomically)")
    p.add_argument("--plot", type=Path, help="loss-curve PNG (default: next to --out)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    gpu = args.device == "gpu"
    args.shapes = (args.shapes or ("seed,small,medium" if gpu else "seed,small")).split(",")
    args.precisions = (args.precisions or ("fp32,tf32" if gpu else "fp32")).split(",")
    if args.compile is None:
        args.compile = gpu
    for name in args.shapes:
        if name not in SHAPES:
            p.error(f"unknown shape {name!r}: expected {', '.join(SHAPES)}")
    for name in args.precisions:
        if name not in ("fp32", "tf32") or (name == "tf32" and not gpu):
            p.error(f"precision {name!r}: expected fp32{', tf32' if gpu else ' on the CPU'}")
    if args.plot is None and args.out is not None:
        args.plot = args.out.with_suffix(".png")
    return args


def plan(args: argparse.Namespace) -> list[Job]:
    modes = [("rustyflow", "eager")] + ([("rustyflow", "graph")] if args.device == "gpu" else [])
    if args.device == "cpu" and get_backend("cpu").kernels.jit is not None:
        modes.append(("rustyflow", "numpy"))  # the pure-NumPy path too, for comparison
    modes += [("pytorch", "eager")] + ([("pytorch", "compile")] if args.compile else [])
    jobs = []
    for shape in args.shapes:
        warmup, steps = DEFAULT_STEPS[args.device][shape]
        steps = args.steps if args.steps is not None else steps
        warmup = args.warmup if args.warmup is not None else warmup
        for precision in args.precisions:
            jobs += [Job(args.device, shape, precision, fw, mode, warmup, steps,
                         max(1, min(args.windows, steps)), args.threads) for fw, mode in modes]
    return jobs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(measure(Job(**json.loads(args.worker)))))
        return 0
    if args.device == "gpu" and (reason := gpu_unavailable_reason()):
        print(f"error: --device gpu: {reason}", file=sys.stderr)
        return 2
    rows = []
    for job in plan(args):
        print(f"[vs_pytorch] {describe_shape(job.shape)} {job.precision} {job.framework} "
              f"{job.mode} ...", file=sys.stderr, flush=True)
        result = measure(job) if args.device == "gpu" else measure_in_worker(job)
        print(f"[vs_pytorch]   {result['status']}"
              + (f", {statistics.median(result['times']) * 1e3:.1f} ms/step"
                 if result["status"] == "ok" else ""), file=sys.stderr, flush=True)
        rows.append((job, result))
    curve: dict[str, Any] | str | None = None
    plot_note = ""
    if args.curve_steps > 0:
        print(f"[vs_pytorch] loss curves: {args.curve_steps} steps ...", file=sys.stderr,
              flush=True)
        if args.device == "cpu":
            import torch

            torch.set_num_threads(backend.set_threads(args.threads))
        try:
            curve = loss_curves(args.device, args.curve_shape, args.curve_steps, args.data_dir)
        except data.DataError as exc:
            curve = f"not run: {exc}"
        if isinstance(curve, dict):
            plot_note = plot_curves(curve, args.plot) if args.plot else "no plot (no --plot)"
    text = render(args, rows, curve, plot_note)
    print(text)
    if args.out:
        write_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
