"""How much cuBLASLt's heuristic leaves on the table: each cuBLASLt GEMM of a GPT-2 124M
training step, run with every algorithm the heuristic offers (its top 8 that fit the
workspace), against its first and against the one RustyFlow runs (the heuristic's first;
for an FP8 problem, the fastest by RustyFlow's own timing at its first call).

The problems are the step's own calls through `CublasLt` (bf16, T = 1024): the Linears'
forward epilogues (bias; bias + GELU keeping the pre-activation; bias + the residual as C)
and weight gradients (x^T @ dy added into the float32 buffer), and, for issue #47's FP8
GEMMs, `matmul_fp8` with fast accumulation. The input gradients go through cuBLAS, which
picks its own algorithm, and are not here. Each problem is planned by one call, then each
candidate algorithm is swapped into its plan and the same call timed (CUDA events, median
of windows). The sums count each block problem 12 times.

    python benchmarks/gemm_algos.py --batch 16 --out gemm-algos.md
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from fp8_gemm import gemm_args, open_lt, report  # noqa: E402
from layernorm_bwd import CupyEvent, time_calls  # noqa: E402

from rustyflow_py.reporting.text import markdown  # noqa: E402

E, LAYERS = 768, 12


def problems(m: int, lt: Any, cupy: Any, bf16: Any) -> list[tuple[str, Callable[[], Any]]]:
    """(name, the call) of each problem, operands allocated once."""
    rng = np.random.default_rng(0)

    def arr(*shape: int, dtype: Any = bf16) -> Any:
        return cupy.asarray(rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dtype)

    out = []
    for name, k, n, kind in (("qkv", E, 3 * E, "bias"), ("attn proj", E, E, "residual"),
                             ("fc", E, 4 * E, "gelu"), ("mlp proj", 4 * E, E, "residual")):
        x, w, b, g = arr(m, k), arr(k, n), arr(n), arr(m, n)
        res, pre = arr(m, n), cupy.empty((m, n), bf16)
        y, dw = cupy.empty((m, n), bf16), arr(k, n, dtype=np.float32)
        if kind == "gelu":
            fwd = lambda x=x, w=w, b=b, y=y, pre=pre: lt.matmul_bias(  # noqa: E731
                x, w, b, gelu=True, out=y, pre_gelu_out=pre)
        elif kind == "residual":
            fwd = lambda x=x, w=w, b=b, y=y, res=res: lt.matmul_bias(  # noqa: E731
                x, w, b, out=y, residual=res)
        else:
            fwd = lambda x=x, w=w, b=b, y=y: lt.matmul_bias(x, w, b, out=y)  # noqa: E731
        out += [(f"{name} fwd ({kind})", fwd),
                (f"{name} wgrad", lambda x=x, g=g, dw=dw: lt.matmul_into(  # noqa: E731
                    x.T, g, dw, accumulate=True))]
    from rustyflow_py.engine.ops.fp8 import cuda as fp8
    from rustyflow_py.engine.ops.fp8.formats import E4M3, E5M2

    for name, k, n in (("qkv", E, 3 * E), ("fc", E, 4 * E), ("mlp proj", 4 * E, E)):
        for gemm, r, c, inner, fa in (("fwd", m, n, k, E4M3), ("wgrad", n, k, m, E5M2)):
            qa, qb = fp8.quantize(arr(r, inner), fa), fp8.quantize(arr(c, inner), E4M3)
            y = cupy.empty((r, c), bf16)
            out.append((f"fp8 {name} {gemm}", lambda qa=qa, qb=qb, y=y: lt.matmul_fp8(  # noqa: E731
                qa, qb, y, fast_accum=True)))
    return out


def main() -> None:
    args = gemm_args(__doc__)

    import cupy
    import ml_dtypes

    _, lt = open_lt()
    rows: list[list[str]] = []
    sums: dict[str, np.ndarray] = {}  # by kind: the heuristic's first, the fastest, ours
    for name, call in problems(args.batch * args.seq, lt, cupy, np.dtype(ml_dtypes.bfloat16)):
        before = set(lt._plans)
        call()
        (key,) = set(lt._plans) - before
        plan = lt._plans[key]
        chosen = plan.algo  # RustyFlow's: the heuristic's first, or for FP8 its own timing's
        runs = [plan.results[i].ptr for i in plan.usable].index(chosen)
        times = []
        for index in plan.usable:
            plan.algo = plan.results[index].ptr
            times.append(time_calls(call, CupyEvent, args.calls, args.windows))
        plan.algo = chosen
        best = int(np.argmin(times))
        kind = "fp8" if name.startswith("fp8") else "bf16"
        sums[kind] = sums.get(kind, 0) + LAYERS * np.array([times[0], times[best], times[runs]])
        rows.append([name, str(len(times)), f"{times[0]:.1f}", f"{times[best]:.1f}",
                     str(best), str(runs), f"{times[0] / times[best]:.3f}x",
                     f"{times[runs] / times[best]:.3f}x", " ".join(f"{t:.0f}" for t in times)])
        print(" | ".join(rows[-1]), flush=True)
    for kind, (first, fastest, ours) in sums.items():
        rows.append([f"{kind} sum x{LAYERS}", "", f"{first / 1e3:.3f} ms",
                     f"{fastest / 1e3:.3f} ms", "", "", f"{first / fastest:.3f}x",
                     f"{ours / fastest:.3f}x", ""])
    head = ["problem", "candidates", "heuristic's first us", "fastest us", "fastest is #",
            "RustyFlow runs #", "first / fastest", "RustyFlow's / fastest",
            "every candidate us"]
    report(f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, M = {args.batch} x "
           f"{args.seq}", markdown(head, rows, {1, 2, 3, 4, 5, 6, 7}), args.out)
    lt.close()


if __name__ == "__main__":
    main()
