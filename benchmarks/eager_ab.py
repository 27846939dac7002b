"""The eager GPU training step of `vs_pytorch.py`, timed in one process per tree, for A/B runs
of two checkouts whose host-side code differs (the engine refactor's before and after).

Why a separate script: an eager step on the GPU is bound by the host (Python and kernel
launches), and on a shared host one process can run 1.5-2x slower than the next for the same
code. A single `vs_pytorch.py` run per tree then compares two draws of that noise; this script
is cheap enough to alternate the trees many times and compare the distributions. Run it with
the tree to time as the working directory, e.g. (before = a `git archive` of the old commit):

    for r in $(seq 10); do
      (cd before && python ../benchmarks/eager_ab.py) >> ab.txt
      python benchmarks/eager_ab.py >> ab.txt
    done

Each run prints one line per shape and precision: the best and the median of 7 windows of 15
steps (after 8 warm-up steps), in ms. The tree is "before" when its `rustyflow_training`
still takes a device name (the API before the run policy), "after" otherwise.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())  # the tree being timed, not an installed package

import benchmarks.vs_pytorch as vp  # noqa: E402
from rustyflow_py.engine.precision import Precision  # noqa: E402

WARMUP, WINDOWS, STEPS = 8, 7, 15


def training(shape: str, precision: str) -> tuple[object, object, object]:
    """The step function, and a batch, on either tree's API."""
    cfg, batch = vp.gpt_config(shape)
    if "backend" in vp.rustyflow_training.__code__.co_varnames:  # after: a run policy
        from rustyflow_py.engine.policy import RunPolicy

        backend = vp.get_backend("gpu", RunPolicy(Precision.of(precision)))
        model, opt, scaler = vp.rustyflow_training(cfg, backend, 10**6)
    else:  # before: settings on the shared backend
        backend = vp.get_backend("gpu")
        backend.set_precision(Precision.of(precision))
        model, opt, scaler = vp.rustyflow_training(cfg, "gpu", precision, 10**6)
    x, y = (backend.from_host(a) for a in vp.synthetic_batch(cfg, batch))
    return vp.rustyflow_step_fn(model, opt, "eager", scaler), (x, y), backend


def main() -> None:
    tree = "after" if "backend" in vp.rustyflow_training.__code__.co_varnames else "before"
    for shape in ("seed", "small"):
        for precision in ("tf32", "bf16"):
            step, (x, y), backend = training(shape, precision)
            for _ in range(WARMUP):
                step(x, y)
            backend.synchronize()
            times = []
            for _ in range(WINDOWS):
                start = time.perf_counter()
                for _ in range(STEPS):
                    step(x, y)
                backend.synchronize()
                times.append((time.perf_counter() - start) / STEPS * 1e3)
            print(f"{tree} {shape} {precision} min {min(times):.3f} "
                  f"med {statistics.median(times):.3f} ms", flush=True)
            del step
            vp.free_gpu_memory()


if __name__ == "__main__":
    main()
