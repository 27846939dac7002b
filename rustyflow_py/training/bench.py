"""`rustyflow bench`: when does the GPU help? Time the product's own training step on the CPU
and the GPU over a grid of model and batch sizes.

Each grid point builds the model (`build_model`), the optimizer (`make_optimizer`) and the step
runner training uses, on random tokens (the time of a step does not depend on the text). The
step runs as it does in training: eager on the CPU, replayed as a CUDA graph on the GPU. After
warm-up, one step is timed to size the run, then enough steps to fill `seconds` (at least
`MIN_STEPS`), with the device synchronised before each clock read. The profiler then gives the
matmul share of the step that runs, measured as training measures it: of the step's wall time
on the CPU, of the device time of sampled CUDA-graph replays on the GPU.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.backend import Backend, gpu_unavailable_reason
from ..engine.library import get_backend
from ..engine.policy import DEFAULT
from ..engine.profiler import Profiler
from ..errors import RustyFlowError
from ..model.gpt import build_model
from ..reporting.plot import PlotError, plot_sweep
from ..reporting.sweep import BENCH_TITLE, format_sweep
from .config.config import Config
from .config.optimizers import make_optimizer
from .evaluation.evaluate import upload_split
from .outputs.ownership import foreign
from .run.graph_profile import STREAK, GraphSampler, choose_mode
from .run.step import StepRunner, quiet_float_errors, use_graph

Say = Callable[[str], None]

VOCAB = 33278  # WikiText-2's
DEFAULT_MODELS = ((1, 32, 2), (2, 128, 4), (4, 256, 4), (6, 384, 6))  # layers, embed, heads
DEFAULT_BATCHES = ((1, 16), (8, 64), (32, 128))  # batch, seq_len
QUICK_MODELS = ((1, 32, 2),)
QUICK_BATCHES = ((2, 16), (4, 32))
MIN_STEPS, MAX_STEPS = 3, 500
PROFILED_STEPS = 2


@dataclasses.dataclass(frozen=True)
class Point:
    """One grid point: the model's shape and the batch layout."""

    layers: int
    embed: int
    heads: int
    batch: int
    seq_len: int

    def config(self, device: str) -> Config:
        return Config(num_layers=self.layers, embed_dim=self.embed, num_heads=self.heads,
                      batch_size=self.batch, seq_len=self.seq_len, device=device)

    def name(self) -> str:
        return (f"L{self.layers} E{self.embed} H{self.heads} B{self.batch} "
                f"T{self.seq_len}")


def grid(models: Sequence[Sequence[int]], batches: Sequence[Sequence[int]]) -> list[Point]:
    """Every model shape (layers, embed, heads) with every batch layout (batch, seq_len)."""
    return [Point(*model, *layout) for model in models for layout in batches]


def sweep(points: Sequence[Point], vocab: int = VOCAB, seconds: float = 1.0,
          say: Say = print, warn: Say | None = None) -> dict[str, Any]:
    """Time every point on the CPU and, when usable, the GPU. Returns the sweep: the devices
    (described, or why the GPU is not usable) and one row per point."""
    warn = warn or say
    reason = gpu_unavailable_reason()
    kinds = ["cpu"] + (["gpu"] if reason is None else [])
    devices: dict[str, Any] = {"gpu": {"usable": False, "reason": reason}}
    # the default policy: fp32, all cores, numba kernels when installed
    backends = {kind: get_backend(kind, DEFAULT).prepared(say, warn) for kind in kinds}
    for kind, backend in backends.items():
        devices[kind] = {"usable": True, "name": backend.hardware(),
                         "describe": backend.describe()}
    rows = []
    for point in points:
        row: dict[str, Any] = {**dataclasses.asdict(point), "vocab": vocab}
        for kind in kinds:
            cell = _time_point(point, backends[kind], vocab, seconds, warn)
            gc.collect()  # this point's model, its buffers and graph, before the next one
            backends[kind].release_cached_memory()
            row.update({k: cell.pop(k) for k in ("params", "flops_per_step") if k in cell})
            row[kind] = cell
            say(f"{kind} {point.name()}: " + (
                cell["error"] if "error" in cell else
                f"{cell['ms_per_step']:.2f} ms/step, {cell['tokens_per_s']:,.0f} tok/s, "
                f"matmul {100 * cell['matmul_share']:.0f}%"))
        cpu, gpu = row.get("cpu", {}), row.get("gpu", {})
        row["speedup"] = (gpu["tokens_per_s"] / cpu["tokens_per_s"]
                          if "tokens_per_s" in cpu and "tokens_per_s" in gpu else None)
        rows.append(row)
    return {"vocab": vocab, "seconds": seconds, "devices": devices, "rows": rows}


def load_results(path: str | Path) -> dict[str, Any]:
    """A bench.json written by `rustyflow bench`, checked by rendering it: a file that is not
    one (truncated, binary, another program's JSON) is an error naming it, not a traceback."""
    def refuse(why: str) -> RustyFlowError:
        return RustyFlowError(f"{path} is not a bench.json written by `rustyflow bench` "
                              f"({why}); pass --from-json the bench.json of a sweep")

    try:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise refuse("it is not UTF-8 text") from None
    except ValueError as exc:
        raise refuse(f"not JSON: {exc}") from None
    except OSError as exc:
        raise refuse(f"it cannot be read: {exc.strerror}") from None
    if not isinstance(result, dict) or not isinstance(result.get("rows"), list):
        raise refuse("no list of rows")
    try:
        format_sweep(result, None)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise refuse(f"a field is missing or of the wrong type: {exc!r}") from None
    return result


def _is_bench_json(path: Path) -> bool:
    try:
        load_results(path)
    except RustyFlowError:
        return False
    return True


def write_results(result: dict[str, Any], folder: str | Path, say: Say = print) -> Path:
    """bench.json (the sweep), speedup.png/.svg (when matplotlib is installed and the GPU was
    measured) and bench.md into `folder`; returns bench.md's path."""
    out = Path(folder)
    fix = "pass --out another folder"
    foreign(str(out / "bench.json"), "bench result", _is_bench_json, fix)
    foreign(str(out / "bench.md"), "bench report",
            lambda p: p.read_bytes().startswith(BENCH_TITLE.encode()), fix)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    plot = None
    if any(row.get("speedup") for row in result["rows"]):
        try:
            plot_sweep(result["rows"], out / "speedup")
            plot = "speedup.png"
        except PlotError as exc:
            say(f"no plot: {exc}")
    report = out / "bench.md"
    report.write_text(format_sweep(result, plot), encoding="utf-8")
    return report


def _time_point(point: Point, backend: Backend, vocab: int, seconds: float,
                warn: Say) -> dict[str, Any]:
    """One point on one device: sizes, step time, tokens/s and the matmul share; a GPU that
    runs out of memory gives {"error": ...} instead of stopping the sweep."""
    kind = backend.kind
    cfg = point.config(kind)
    tokens = np.random.default_rng(0).integers(0, vocab, point.batch * (8 * point.seq_len + 1))
    try:
        with quiet_float_errors():
            model = build_model(cfg, vocab, backend)
            stream = upload_split(backend, tokens, point.batch)
            optimizer = make_optimizer(cfg, model.buffer, total_steps=10**6)

            def runner(profiler: Profiler | None, graph: bool,
                       sampler: GraphSampler | None = None) -> StepRunner:
                return StepRunner(model, optimizer, stream, point.seq_len, log_interval=1,
                                  profiler=profiler, profile_steps=PROFILED_STEPS, graph=graph,
                                  warn=warn, sampler=sampler)

            timed = _steps_per_second(runner(None, use_graph("auto", kind, warn)),
                                      backend, seconds)
            share = _matmul_share(runner, backend, warn)
    except Exception as exc:
        if type(exc).__name__ != "OutOfMemoryError":
            raise
        return {"error": f"out of memory ({exc})"}
    tokens_per_step = point.batch * point.seq_len
    return {"params": model.num_params(),
            "flops_per_step": model.matmul_flops_per_step(point.batch, point.seq_len),
            "ms_per_step": 1e3 / timed["steps_per_s"],
            "tokens_per_s": timed["steps_per_s"] * tokens_per_step, "steps": timed["steps"],
            "graph": timed["graph"], "matmul_share": share}


def _steps_per_second(runner: StepRunner, backend: Any, seconds: float) -> dict[str, Any]:
    """Warm up (on the GPU: the eager step, then the capture), time one step to size the run,
    then time enough steps to fill `seconds`."""
    step = 0
    for _ in range(2):
        runner.run(step)
        step += 1
    backend.synchronize()
    start = time.perf_counter()
    runner.run(step)
    step += 1
    backend.synchronize()
    one = time.perf_counter() - start
    n = max(MIN_STEPS, min(MAX_STEPS, math.ceil(seconds / max(one, 1e-9))))
    start = time.perf_counter()
    for _ in range(n):
        runner.run(step)
        step += 1
    backend.synchronize()
    return {"steps_per_s": n / (time.perf_counter() - start), "steps": n,
            "graph": runner.captured is not None}


def _matmul_share(runner: Callable[..., StepRunner], backend: Any,
                  warn: Say) -> float:
    """The matmul share of the step that runs, measured as training measures it: on the GPU
    of the device time of sampled CUDA-graph replays (the eager window when the graph profile
    cannot be made, which the warning says), on the CPU of the wall time of a few steps."""
    prof = Profiler(backend)
    mode, tracer, _ = choose_mode("auto", backend.kind, True, warn)
    if mode == "graph" and tracer is not None:
        window = runner(prof, True, GraphSampler(prof, tracer, PROFILED_STEPS, budget=None))
        # warm-up, capture, a first replay, then the samples (each after a run of busy launches)
        for step in range(3 + STREAK * PROFILED_STEPS):
            window.run(step)
        assert prof.graph is not None
        whole = prof.graph.totals()["span_s"]
    else:
        window = runner(prof, False)
        for step in range(PROFILED_STEPS + (backend.kind == "gpu")):
            window.run(step)
        whole = prof.total() if backend.kind == "gpu" else window.profiled_wall
    return prof.total("matmul") / whole if whole > 0 else 0.0


def requested_grid(models: Sequence[str], batches: Sequence[str],
                   quick: bool = False) -> list[Point]:
    """The grid the command line asks for: `models` as 'LxExH' (layers, embed, heads) and
    `batches` as 'BxT' (batch, seq_len), else the default (or `quick`) ones. Raises
    ValueError for a malformed value or a shape training would refuse, before any work."""
    shapes = _parse(models, 3, "--model") or (QUICK_MODELS if quick else DEFAULT_MODELS)
    layouts = _parse(batches, 2, "--batch") or (QUICK_BATCHES if quick else DEFAULT_BATCHES)
    out = grid(shapes, layouts)
    for point in out:
        point.config("cpu")  # a ConfigError (a ValueError) names the key, e.g. EMBED_DIM
    return out


def _parse(values: Sequence[str], size: int, what: str) -> list[tuple[int, ...]]:
    out = []
    for value in values:
        parts = value.lower().split("x")
        if len(parts) != size or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"{what} {value!r}: expected {size} positive integers joined by "
                             f"'x'")
        out.append(tuple(int(p) for p in parts))
    return out
