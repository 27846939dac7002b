"""The eager training step of `vs_pytorch.py` (on the GPU, or the CPU with --device cpu) in two
trees, timed in ONE process with their windows interleaved, for A/B runs of checkouts whose
host-side code differs (the engine refactor's before and after).

Why one process: an eager step on the GPU is bound by the host (Python and kernel launches),
and on a shared host one process can run 1.5-2x slower than the next for the same code, so
separate runs per tree compare draws of that noise. Here both trees' models live in one
process, and each pair of windows (one per tree, the order alternating) runs under the same
conditions; the ratio of each pair's times is what is summarised. Run it from the tree to time
("after"), with a `git archive` of the other ("before"):

    mkdir before && git archive 69e3bf1 | tar -x -C before
    python benchmarks/eager_ab.py before

The before tree's package is loaded under another name (`rustyflow_before`, a copy in a
temporary folder), and its `benchmarks/vs_pytorch.py` with the name replaced, so both import
side by side. A tree is "before" when its `rustyflow_training` still takes a device name (the
API before the run policy). Prints one line per shape and precision: each tree's median and
best window (ms per step) and the median and quartiles of the paired after/before ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, os.getcwd())  # the tree being timed, not an installed package

import benchmarks.vs_pytorch as after  # noqa: E402

WARMUP = 8


def load_before(tree: Path, into: Path) -> types.ModuleType:
    """The before tree's vs_pytorch module, its package imported as rustyflow_before."""
    shutil.copytree(tree / "rustyflow_py", into / "rustyflow_before",
                    ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(into))
    source = (tree / "benchmarks" / "vs_pytorch.py").read_text()
    module = types.ModuleType("vs_pytorch_before")
    module.__file__ = str(into / "vs_pytorch_before.py")
    sys.modules[module.__name__] = module
    exec(compile(source.replace("rustyflow_py", "rustyflow_before"), module.__file__, "exec"),
         module.__dict__)
    return module


def training(vp: types.ModuleType, shape: str, precision: str, device: str = "gpu"
             ) -> tuple[Any, Any]:
    """One eager step (a closure over its batch) and its backend, on either tree's API."""
    package = vp.GPT.__module__.split(".")[0]
    precisions = sys.modules[f"{package}.engine.precision"].Precision
    cfg, batch = vp.gpt_config(shape)
    if "backend" in vp.rustyflow_training.__code__.co_varnames:  # after: a run policy
        policy = sys.modules[f"{package}.engine.policy"].RunPolicy
        backend = vp.get_backend(device, policy(precisions.of(precision)))
        model, opt, scaler = vp.rustyflow_training(cfg, backend, 10**6)
    else:  # before: settings on the shared backend
        backend = vp.get_backend(device)
        backend.set_precision(precisions.of(precision))
        model, opt, scaler = vp.rustyflow_training(cfg, device, precision, 10**6)
    x, y = (backend.from_host(a) for a in vp.synthetic_batch(cfg, batch))
    step = vp.rustyflow_step_fn(model, opt, "eager", scaler)
    return (lambda: step(x, y)), backend


def window(run: Any, backend: Any, steps: int) -> float:
    """ms per step over `steps` steps, with `backend`'s stream current: each tree's CuPy
    kernels must run on the stream its own cuBLAS calls and synchronize() use."""
    backend.make_current()
    backend.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        run()
    backend.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="the other tree (a git archive of its commit)")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--shapes", default="seed,small")
    ap.add_argument("--precisions", default="tf32,bf16")
    ap.add_argument("--pairs", type=int, default=24, help="window pairs per configuration")
    ap.add_argument("--steps", type=int, default=10, help="steps per window")
    args = ap.parse_args()
    if args.pairs < 2:
        ap.error("--pairs must be at least 2 (the quartiles of the pairs' ratios are reported)")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": load_before(args.before.resolve(), Path(tmp)), "after": after}
        for shape in args.shapes.split(","):
            for precision in args.precisions.split(","):
                runs = {name: training(vp, shape, precision, args.device)
                        for name, vp in trees.items()}
                for run, backend in runs.values():
                    backend.make_current()
                    for _ in range(WARMUP):
                        run()
                    backend.synchronize()
                times: dict[str, list[float]] = {"before": [], "after": []}
                for pair in range(args.pairs):
                    for name in ("before", "after") if pair % 2 == 0 else ("after", "before"):
                        times[name].append(window(*runs[name], args.steps))
                ratios = [a / b for a, b in zip(times["after"], times["before"], strict=True)]
                q1, _, q3 = statistics.quantiles(ratios, n=4)
                print(f"{shape} {precision}: " + " | ".join(
                    f"{name} median {statistics.median(t):.3f} best {min(t):.3f} ms"
                    for name, t in times.items())
                    + f" | after/before median {statistics.median(ratios):.3f} (quartiles "
                    f"{q1:.3f}, {q3:.3f}) over {args.pairs} pairs of {args.steps}-step windows",
                    flush=True)
                del runs
                if args.device == "gpu":
                    after.free_gpu_memory()


if __name__ == "__main__":
    main()
