"""cuBLAS/cuBLASLt bindings compared: nvmath-python's high-level Matmul, and the package's own
GEMMs through nvmath's low-level bindings against the ctypes binding they replaced.

The question this answers: which binding should the package call? It must (1) compute the
same GEMM-with-epilogue problems the Linear layers use, (2) be captured into a CUDA graph (a
training step is one), and (3) be as fast, both replayed in a graph (device time) and called
eagerly (host time per call, which an eager step pays once per GEMM).

    python benchmarks/gemm_bindings.py --ctypes DIR --out benchmarks/results/gemm-bindings-h100.md

DIR holds cublas.py and cublaslt.py of a revision that still called cuBLAS through ctypes
(`git show 9dac08b:rustyflow_py/engine/ops/gemm/cublaslt.py`); without it only the
high-level comparison runs. The problems are GPT-2 124M's (B*T = 16384 rows, E = 768) in
bf16, plus small problems where the host's time per call is all there is. Each answer is
checked against the other binding's. Needs CuPy and nvmath-python (the gpu or cuda13 extra).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import platform
import statistics
import sys
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
    """Mean device time of `launch` in µs over `reps` launches (after two warm-ups: one
    here, one in the package's clock)."""
    from rustyflow_py.engine.devices import device_time as clock

    launch()
    return clock(cp, stream, launch, reps) * 1e3


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
    parser.add_argument("--ctypes", type=Path, default=None,
                        help="a folder with the ctypes binding's cublas.py and cublaslt.py")
    parser.add_argument("--out", type=Path, default=None,
                        help="append the results here, as a dated section")
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
    plain_case("LM head logits, no epilogue (M x 768 @ 768 x 50304)", e, 50304)
    eager_case("eager call, BIAS 64 x 128 @ 128 x 128 (nvmath: reset_operands)", 64, 128)
    eager_case("eager call, BIAS 64 x 128 @ 128 x 128 (nvmath: reset_operands_unchecked)",
               64, 128, unchecked=True)

    dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    command = f"python benchmarks/gemm_bindings.py --rows {m} --reps {args.reps}" + (
        f" --ctypes {args.ctypes}" if args.ctypes else "")
    lines = [
        f"## {datetime.date.today()}: nvmath-python {nvmath.__version__}",
        "",
        f"Device: {dev}; CuPy {cp.__version__}; cuBLASLt {ours.version}; Python "
        f"{platform.python_version()}; M = {m} rows; dtype {cp.dtype(dtype).name}.",
        f"Command: `{command}`.",
        "",
        "### The package's GEMMs against nvmath's high-level Matmul",
        "",
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
    if args.ctypes:
        lines += low_level(cp, stream, args.ctypes, arr, m, args.reps)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with args.out.open("a") as out:
            out.write("\n" + text)


def load_ctypes(folder: Path) -> tuple[Any, Any]:
    """The ctypes binding's Cublas and CublasLt classes, from `folder`'s cublas.py and
    cublaslt.py, loaded as modules of the gemm package (their relative imports resolve)."""
    classes = []
    for name, cls in (("cublas", "Cublas"), ("cublaslt", "CublasLt")):
        full = f"rustyflow_py.engine.ops.gemm._ctypes_{name}"
        spec = importlib.util.spec_from_file_location(full, folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module  # where dataclasses look their module up
        spec.loader.exec_module(module)
        classes.append(getattr(module, cls))
    return classes[0], classes[1]


def low_level(cp: Any, stream: Any, folder: Path, arr: Callable[..., Any], m: int,
              reps: int) -> list[str]:
    """The package's Cublas and CublasLt on nvmath's low-level bindings against the ctypes
    ones of `folder`: device µs per replay of one captured GPT-2 layer's GEMMs plus the LM
    head, and host µs per eager call of small problems. Each binding is measured five times
    in turn (A B A B ...), the median kept; the outputs are compared."""
    from rustyflow_py.engine.ops.gemm.cublas import Cublas
    from rustyflow_py.engine.ops.gemm.cublaslt import CublasLt

    old_cublas, old_lt = load_ctypes(folder)
    bindings = {"ctypes": (old_cublas(cp, stream), old_lt(cp, stream)),
                "nvmath": (Cublas(cp, stream), CublasLt(cp, stream))}
    e, vocab = 768, 50304
    layers = [(e, 3 * e, False, False), (e, e, False, True), (e, 4 * e, True, False),
              (4 * e, e, False, True)]  # (K, N, GELU, residual): c_attn, attn c_proj, c_fc, c_proj
    weights = [(arr(k, n, scale=0.02), arr(n, scale=0.1), arr(m, k), arr(m, n, scale=0.1))
               for k, n, _, _ in layers]  # w, b, x, the output's gradient g
    head, h = arr(vocab, e, scale=0.02), arr(m, e)

    def outputs() -> dict[str, Any]:
        dt = h.dtype
        with stream:
            made = {"logits": cp.empty((m, vocab), dt)}
            for i, (k, n, gelu, _) in enumerate(layers):
                made |= {f"y{i}": cp.empty((m, n), dt), f"dw{i}": cp.zeros((k, n), cp.float32),
                         f"dx{i}": cp.empty((m, k), dt)}
                if gelu:
                    made[f"pre{i}"] = cp.empty((m, n), dt)
        return made

    def sequence(plain: Any, lt: Any, out: dict[str, Any]) -> None:
        """A layer's forward epilogue GEMMs, its weight gradients added into float32
        buffers, its input gradients, and the tied LM head's logits."""
        for i, ((_, _, gelu, residual), (w, b, x, g)) in enumerate(zip(layers, weights,
                                                                        strict=True)):
            lt.matmul_bias(x, w, b, gelu=gelu, out=out[f"y{i}"],
                           pre_gelu_out=out.get(f"pre{i}"), residual=g if residual else None)
            lt.matmul_into(x.T, g, out[f"dw{i}"], accumulate=True)
            plain.matmul(g, w.T, out=out[f"dx{i}"])
        plain.matmul(h, head.T, out=out["logits"])

    results, graphs = {}, {}
    for name, (plain, lt) in bindings.items():
        out = outputs()
        with stream:
            sequence(plain, lt, out)  # eager: plans every problem
        stream.synchronize()
        graphs[name], _ = captured(cp, stream, lambda p=plain, q=lt, o=out: sequence(p, q, o))
        results[name] = out
    diff = max(rel_diff(cp, results["nvmath"][k], results["ctypes"][k])
               for k in results["ctypes"] if not k.startswith("dw"))
    replay = {name: [] for name in bindings}
    for _ in range(5):
        for name, graph in graphs.items():
            replay[name].append(device_time(cp, stream, lambda g=graph: g.launch(stream), reps))

    x, w, b = arr(64, 128), arr(128, 128, scale=0.02), arr(128, scale=0.1)
    xs = [x, arr(64, 128)]
    with stream:
        y, pre, acc = (cp.empty((64, 128), x.dtype), cp.empty((64, 128), x.dtype),
                       cp.zeros((128, 128), cp.float32))
    flip = [0]

    def calls(plain: Any, lt: Any) -> dict[str, Callable[[], Any]]:
        def turn() -> Any:
            flip[0] ^= 1
            return xs[flip[0]]

        return {"BIAS 64 x 128 @ 128 x 128 (CublasLt.matmul_bias)":
                lambda: lt.matmul_bias(turn(), w, b, out=y),
                "GELU_AUX_BIAS, same shapes": lambda: lt.matmul_bias(turn(), w, b, gelu=True,
                                                                     out=y, pre_gelu_out=pre),
                "dW += x.T @ g into float32 (CublasLt.matmul_into)":
                lambda: lt.matmul_into(turn().T, y, acc, accumulate=True),
                "plain 64 x 128 @ 128 x 128 (Cublas.matmul)":
                lambda: plain.matmul(turn(), w, out=y)}

    eager: dict[str, dict[str, list[float]]] = {}
    with stream:
        for _ in range(5):
            for name, (plain, lt) in bindings.items():
                for problem, call in calls(plain, lt).items():
                    times = eager.setdefault(problem, {}).setdefault(name, [])
                    times.append(host_time(stream, call, reps * 20))

    def pct(new: float, old: float) -> str:
        return f"{(new / old - 1) * 100:+.1f}%"

    graph_old, graph_new = (statistics.median(replay[n]) for n in ("ctypes", "nvmath"))
    lines = [
        "", "### nvmath's low-level bindings (`nvmath.bindings.cublas`, `.cublasLt`) against "
        "the ctypes binding", "",
        f"Graph: device µs per replay of one captured sequence of {len(layers) * 3 + 1} "
        "GEMMs (a GPT-2 layer's four Linear forwards through cuBLASLt epilogues, their "
        "weight gradients added into float32 buffers, their input gradients through cuBLAS, "
        f"and the tied LM head's logits), median of 5 alternating runs of {reps} replays "
        f"(runs: ctypes {', '.join(f'{v:.1f}' for v in replay['ctypes'])}; nvmath "
        f"{', '.join(f'{v:.1f}' for v in replay['nvmath'])}). Eager: host µs per call, "
        f"median of 5 alternating runs of {reps * 20} calls. Max rel diff of the outputs "
        f"(float32 gradients aside, which accumulate over the runs): {diff:.2e}.", "",
        "| measurement | ctypes | nvmath bindings | change |", "|---|---:|---:|---:|",
        f"| graph replay, µs | {graph_old:.1f} | {graph_new:.1f} | "
        f"{pct(graph_new, graph_old)} |"]
    for problem, by in eager.items():
        old, new = statistics.median(by["ctypes"]), statistics.median(by["nvmath"])
        lines.append(f"| eager call, {problem}, host µs | {old:.2f} | {new:.2f} | "
                     f"{pct(new, old)} |")
    return lines


if __name__ == "__main__":
    main()
