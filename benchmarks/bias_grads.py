"""A Linear layer's weight and bias gradients at GPT-2 124M's shapes, two ways, on the GPU.

The question this answers: where should the bias gradient (the column sums of the output
gradient g) come from, once the weight gradient dW = x.T @ g is a GEMM that adds into the
float32 gradient buffer (beta = 1)?

- `bgrada`: cuBLASLt's BGRADA epilogue on the dW GEMM (what the Linear layers used before);
  it cannot add into a buffer, so db is written fresh and then added (a small add).
- `sum_rows`: the dW GEMM without an epilogue, then the kernel set's sum_rows: for 16-bit g,
  db += ones(1, M) @ g as a second cuBLASLt GEMM (beta = 1).

    python benchmarks/bias_grads.py --out benchmarks/results/bias-grads-h100.md

Rows: B*T = 16384 (B = 16, T = 1024), E = 768, bf16 inputs, float32 gradients; device time
per call, the mean of 50 launches after two warm-ups. Each way's dW and db are checked
against the other's.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
from gemm_bindings import device_time  # benchmarks/ is the script's folder: on sys.path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the working tree's package, installed or not
ROWS, E = 16 * 1024, 768
LAYERS = {"attn.c_attn": (E, 3 * E), "attn.c_proj": (E, E), "mlp.c_fc": (E, 4 * E),
          "mlp.c_proj": (4 * E, E)}  # (K, N): x (ROWS, K), g (ROWS, N)
REPS = 50


def measure(cp: Any, kernels: Any, lt: Any, stream: Any, kk: int, n: int,
            dtype: Any) -> dict[str, float]:
    """Device µs per call of each way at x (ROWS, kk), g (ROWS, n); the answers checked."""
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((ROWS, kk), dtype=np.float32).astype(dtype)
    g = rng.standard_normal((ROWS, n), dtype=np.float32).astype(dtype)
    dw, db = cp.zeros((kk, n), np.float32), cp.zeros(n, np.float32)

    def alone() -> None:
        lt.matmul_into(x.T, g, dw, accumulate=True)

    def bgrada() -> None:
        w_grad, b_grad = lt.matmul_bgrad(x.T, g, out_dtype=np.float32)
        dw.__iadd__(w_grad)
        db.__iadd__(b_grad)

    def sum_rows() -> None:
        alone()
        kernels.sum_rows(g, db)

    times, results = {}, {}
    for label, fn in (("alone", alone), ("bgrada", bgrada), ("sum_rows", sum_rows)):
        times[label] = device_time(cp, stream, fn, REPS)
        dw[...] = 0
        db[...] = 0
        fn()
        results[label] = (cp.asnumpy(dw), cp.asnumpy(db))
    for got, want in zip(results["sum_rows"], results["bgrada"], strict=True):
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 1e-4, (kk, n, err)
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    import cupy as cp
    import ml_dtypes

    from rustyflow_py.engine.backend import get_backend
    from rustyflow_py.engine.policy import RunPolicy
    from rustyflow_py.engine.precision import Precision

    backend = get_backend("gpu", RunPolicy(Precision.of("bf16")))
    kernels, stream = backend.kernels, backend.stream
    lt = kernels._lt()
    lines = ["| layer (K, N) | dW GEMM alone | bgrada | sum_rows | db's cost: sum_rows | "
             "bgrada |", "|---|---:|---:|---:|---:|---:|"]
    totals = np.zeros(3)
    with stream:
        for name, (kk, n) in LAYERS.items():
            t = measure(cp, kernels, lt, stream, kk, n, np.dtype(ml_dtypes.bfloat16))
            row = np.array([t["alone"], t["bgrada"], t["sum_rows"]])
            totals += row
            lines.append(f"| {name} ({kk}, {n}) | " + " | ".join(f"{v:.1f}" for v in row)
                         + f" | {row[2] - row[0]:.1f} | {row[1] - row[0]:.1f} |")
    lines.append("| the four, x12 layers (a step's) | "
                 + " | ".join(f"{v * 12:.0f}" for v in totals)
                 + f" | {(totals[2] - totals[0]) * 12:.0f} | {(totals[1] - totals[0]) * 12:.0f} |")
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    text = "\n".join([
        "# Weight and bias gradients of a Linear layer: where db comes from",
        "",
        "- Command: `python benchmarks/bias_grads.py --out benchmarks/results/bias-grads-h100.md`",
        f"- Machine: {name}, CuPy {cp.__version__}, cuBLASLt {lt.version}, "
        f"Python {platform.python_version()}",
        f"- Shapes: {ROWS} rows (GPT-2 124M at B=16, T=1024), bf16 inputs, float32 dW and db "
        f"added into buffers; device µs per call, the mean of {REPS}; the last row in µs a "
        "step (12 layers)",
        "",
        *lines, ""])
    print(text)
    if args.out:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
