"""cuBLASLt through NVIDIA's nvmath-python against rustyflow's own ctypes binding.

The question this answers: can the maintained binding replace the hand-written one? It must
(1) compute the same GEMM-with-epilogue problems the Linear layers use, (2) be captured into
a CUDA graph (a training step is one), and (3) be as fast, both replayed in a graph (device
time) and called eagerly (host time per call, which an eager step pays once per GEMM).

    python benchmarks/gemm_bindings.py --out benchmarks/results/gemm-bindings-h100.md

The problems are GPT-2 124M's (B*T = 16384 rows, E = 768) in bf16, plus a small problem
where the host's time per call is all there is. Both bindings are given the same operands;
each answer is checked against the other. Needs CuPy and nvmath-python (`pip install
nvmath-python`; the package itself does not use it, see engine/ops/gemm/cublaslt.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


@dataclasses.dataclass
class Row:
    problem: str
    ours_graph_us: float | None = None
    nvmath_graph_us: float | None = None
    ours_eager_us: float | None = None
    nvmath_eager_us: float | None = None
    max_rel_diff: float | None = None
    note: str = ""


def device_time(cp: Any, stream: Any, launch: Callable[[], None], reps: int) -> float:
    """Mean device time of `launch` in µs over `reps` launches (after two warm-ups)."""
    for _ in range(2):
        launch()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(reps):
        launch()
    stop.record(stream)
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1e3 / reps


def host_time(stream: Any, call: Callable[[], None], reps: int) -> float:
    """Mean host wall time of `call` in µs (the device keeps up: small problems)."""
    for _ in range(3):
        call()
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    stream.synchronize()
    return (time.perf_counter() - t0) * 1e6 / reps


def captured(cp: Any, stream: Any, body: Callable[[], Any]) -> tuple[Any, Any]:
    """(graph, what body returned at capture): body recorded once on `stream`."""
    pool = cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        try:
            out = body()
        finally:
            graph = stream.end_capture()
    graph.upload(stream)
    return graph, (out, pool)


def rel_diff(cp: Any, a: Any, b: Any) -> float:
    a, b = cp.asarray(a, dtype=cp.float32), cp.asarray(b, dtype=cp.float32)
    return float(cp.abs(a - b).max() / max(float(cp.abs(b).max()), 1e-30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16384, help="B*T (GPT-2 124M: 16 x 1024)")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    args = parser.parse_args()

    import cupy as cp
    import nvmath
    from nvmath.linalg.advanced import Matmul, MatmulEpilog

    from rustyflow_py.engine.ops.gemm.cublas import Cublas
    from rustyflow_py.engine.ops.gemm.cublaslt import CublasLt
    from rustyflow_py.engine.precision import bfloat16

    stream = cp.cuda.Stream(non_blocking=True)
    ours, ours_plain = CublasLt(cp, stream), Cublas(cp, stream)
    rng = np.random.default_rng(0)
    dtype = bfloat16()

    def arr(*shape: int, scale: float = 1.0) -> Any:
        with stream:
            return cp.asarray(rng.standard_normal(shape).astype(np.float32) * scale).astype(dtype)

    rows: list[Row] = []
    m, e = args.rows, 768

    def forward_case(name: str, k: int, n: int, gelu: bool) -> None:
        """y = x @ w + b (BIAS) or gelu(x @ w + b) keeping the pre-activation (GELU_AUX_BIAS)."""
        row = Row(name)
        rows.append(row)
        x, w, b = arr(m, k), arr(k, n, scale=0.02), arr(n, scale=0.1)
        y_ours = cp.empty((m, n), dtype)
        pre_ours = cp.empty((m, n), dtype) if gelu else None

        def run_ours() -> None:
            ours.matmul_bias(x, w, b, gelu=gelu, out=y_ours, pre_gelu_out=pre_ours)

        # nvmath's bias runs along the result's rows, so it computes y^T = w^T x^T (N x M,
        # column-major: y's row-major memory); the epilogue needs that column order anyway.
        epilog = MatmulEpilog.GELU_AUX_BIAS if gelu else MatmulEpilog.BIAS
        try:
            with stream:
                mm = Matmul(w.T, x.T, stream=stream)
                mm.plan(epilog=epilog, epilog_inputs={"bias": b}, stream=stream)
                got = mm.execute(stream=stream)
            y_nv = (got[0] if isinstance(got, tuple) else got).T
            run_ours()
            stream.synchronize()
            row.max_rel_diff = rel_diff(cp, y_nv, y_ours)
            graph_o, _ = captured(cp, stream, run_ours)
            row.ours_graph_us = device_time(cp, stream, lambda: graph_o.launch(stream), args.reps)
            graph_n, _ = captured(cp, stream, lambda: mm.execute(stream=stream))
            row.nvmath_graph_us = device_time(cp, stream, lambda: graph_n.launch(stream),
                                              args.reps)
        except Exception as exc:  # the finding is the refusal itself: say it in the table
            row.note = f"nvmath: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"

    def bgrad_case(name: str, k: int, n: int) -> None:
        """(dW, db) = (a^T g, column sums of g) with dW in float32 (BGRADA in ours)."""
        row = Row(name)
        rows.append(row)
        a, g = arr(m, k), arr(m, n, scale=0.1)
        dw = cp.empty((k, n), cp.float32)
        db = cp.empty((n,), cp.float32)

        def run_ours() -> None:
            ours.matmul_bgrad(a.T, g, out=dw, bias_grad_out=db, out_dtype=cp.float32)

        try:
            run_ours()  # plans outside the capture, as a training step's first eager run does
            graph_o, _ = captured(cp, stream, run_ours)
            row.ours_graph_us = device_time(cp, stream, lambda: graph_o.launch(stream), args.reps)
            # dW^T (N x K) = g^T a: nvmath's BGRADA sums A = g^T over k = M: db. The float32
            # result of bf16 operands is asked for through an in-place float32 C.
            c = cp.zeros((n, k), cp.float32, order="F")
            with stream:
                mm = Matmul(g.T, a, c=c, beta=0.0, options={"inplace": True}, stream=stream)
                mm.plan(epilog=MatmulEpilog.BGRADA, stream=stream)
                got = mm.execute(stream=stream)
            stream.synchronize()
            row.max_rel_diff = rel_diff(cp, c.T, dw)
            row.note = f"nvmath returned {type(got).__name__}"
            graph_n, _ = captured(cp, stream, lambda: mm.execute(stream=stream))
            row.nvmath_graph_us = device_time(cp, stream, lambda: graph_n.launch(stream),
                                              args.reps)
        except Exception as exc:
            row.note = f"nvmath: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"

    def plain_case(name: str, k: int, n: int) -> None:
        """The tied LM head's logits h @ wte^T, no epilogue (ours: the cuBLAS binding)."""
        row = Row(name)
        rows.append(row)
        h, wte = arr(m, k), arr(n, k, scale=0.02)
        logits = cp.empty((m, n), dtype)

        def run_ours() -> None:
            ours_plain.matmul(h, wte.T, out=logits)

        try:
            run_ours()
            graph_o, _ = captured(cp, stream, run_ours)
            row.ours_graph_us = device_time(cp, stream, lambda: graph_o.launch(stream), args.reps)
            with stream:
                mm = Matmul(h, wte.T, stream=stream)
                mm.plan(stream=stream)
                got = mm.execute(stream=stream)
            stream.synchronize()
            row.max_rel_diff = rel_diff(cp, got, logits)
            graph_n, _ = captured(cp, stream, lambda: mm.execute(stream=stream))
            row.nvmath_graph_us = device_time(cp, stream, lambda: graph_n.launch(stream),
                                              args.reps)
        except Exception as exc:
            row.note = f"nvmath: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"

    def eager_case(name: str, rows_: int, size: int, unchecked: bool = False) -> None:
        """Host time per call of a tiny BIAS GEMM with fresh operands each call, the way an
        eager step calls it (nvmath: reset_operands + execute on one planned object)."""
        row = Row(name)
        rows.append(row)
        xs = [arr(rows_, size) for _ in range(2)]
        w, b = arr(size, size, scale=0.02), arr(size, scale=0.1)
        y = cp.empty((rows_, size), dtype)
        flip = [0]

        def call_ours() -> None:
            flip[0] ^= 1
            ours.matmul_bias(xs[flip[0]], w, b, out=y)

        row.ours_eager_us = host_time(stream, call_ours, args.reps * 20)
        try:
            with stream:
                mm = Matmul(w.T, xs[0].T, stream=stream)
                mm.plan(epilog=MatmulEpilog.BIAS, epilog_inputs={"bias": b}, stream=stream)

            reset = mm.reset_operands_unchecked if unchecked else mm.reset_operands

            def call_nv() -> None:
                flip[0] ^= 1
                reset(a=w.T, b=xs[flip[0]].T, stream=stream)
                mm.execute(stream=stream)

            row.nvmath_eager_us = host_time(stream, call_nv, args.reps * 20)
        except Exception as exc:
            row.note = f"nvmath: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"

    forward_case("c_fc forward, GELU_AUX_BIAS (M x 768 @ 768 x 3072)", e, 4 * e, True)
    forward_case("c_proj forward, BIAS (M x 3072 @ 3072 x 768)", 4 * e, e, False)
    bgrad_case("c_fc weight + bias grad, BGRADA, fp32 out (768 x M @ M x 3072)", e, 4 * e)
    plain_case("LM head logits, no epilogue (M x 768 @ 768 x 50304)", e, 50304)
    eager_case("eager call, BIAS 64 x 128 @ 128 x 128 (nvmath: reset_operands)", 64, 128)
    eager_case("eager call, BIAS 64 x 128 @ 128 x 128 (nvmath: reset_operands_unchecked)",
               64, 128, unchecked=True)

    dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    lines = [
        f"# cuBLASLt bindings: rustyflow's ctypes vs nvmath-python {nvmath.__version__}",
        "",
        f"Device: {dev}; CuPy {cp.__version__}; cuBLASLt {ours.version}; Python "
        f"{platform.python_version()}; M = {m} rows; dtype {cp.dtype(dtype).name}.",
        f"Command: `python benchmarks/gemm_bindings.py --rows {m} --reps {args.reps}`.",
        "Graph: device µs per replay of a graph holding the one GEMM. Eager: host µs per call.",
        "",
        "| problem | ours graph µs | nvmath graph µs | ours eager µs | nvmath eager µs | "
        "max rel diff | note |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]

    def fmt(v: float | None, spec: str = ".1f") -> str:
        return "—" if v is None else format(v, spec)

    for r in rows:
        lines.append(f"| {r.problem} | {fmt(r.ours_graph_us)} | {fmt(r.nvmath_graph_us)} | "
                     f"{fmt(r.ours_eager_us)} | {fmt(r.nvmath_eager_us)} | "
                     f"{fmt(r.max_rel_diff, '.2e')} | {r.note} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
