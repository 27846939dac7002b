"""PRECISION=fp8's casts on the GPU, kernel by kernel, at GPT-2 124M's shapes (B=16, T=1024):
the very calls a training step makes (fp8/cuda.py), against PyTorch's cast of the same tensor
(amax, scale, cast, transposed copy; its eager ops, replayed from a CUDA graph).

- The two-layout cast (`quantize_both`) under current scaling (an amax pass, then the cast)
  and delayed scaling (one kernel scaled from its site).
- The MLP's GELU backward writing dpre's e5m2 codes itself (`gelu_backward_codes`, delayed),
  against the GELU backward with its bias sums (`gelu_backward`) followed by the delayed cast
  of its output.
- The LayerNorm next to a Linear writing its output's codes too (`layernorm_forward_codes`,
  e4m3, and `layernorm_backward_codes`, e5m2, with the residual joined and dw's and db's
  sums; delayed), against the LayerNorm followed by the delayed cast.

Device time per call: `--calls` calls captured in one CUDA graph (on the backend's stream,
as the trainer's step is; PyTorch's in a graph of its own), its replays timed by CUDA events,
the median of `--windows` replays. So a row is the kernels' time, not the host's launches.

    python benchmarks/fp8_casts.py --out benchmarks/results/fp8-casts-h200.md
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# GPT-2 124M at B=16, T=1024: a block's activations, gradients and a weight
SHAPES = {"x (N, E)": (16384, 768), "qkv gradient (N, 3E)": (16384, 2304),
          "MLP hidden (N, 4E)": (16384, 3072), "weight (E, 4E)": (768, 3072)}


def median_us(fn: Callable[[], Any], calls: int, windows: int) -> float:
    """Median over `windows` replays of a graph of `calls` calls of fn, in microseconds a
    call (fn's arrays made in the capture come from a pool of the graph's own)."""
    import cupy as cp

    from rustyflow_py.engine.library import get_backend

    cp.cuda.Device().synchronize()  # the inputs, made on another stream
    backend = get_backend("gpu")
    backend.make_current()
    stream = backend.stream
    for _ in range(2):
        fn()
    pool = cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        try:
            for _ in range(calls):
                fn()
        finally:
            graph = stream.end_capture()
    graph.upload(stream)
    graph.launch(stream)
    out = []
    for _ in range(windows):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / calls)
    return statistics.median(out)


def torch_us(fn: Callable[[], Any], calls: int, windows: int) -> float:
    """median_us for PyTorch's calls, in a torch.cuda.CUDAGraph."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    out = []
    for _ in range(windows):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        out.append(start.elapsed_time(stop) * 1e3 / calls)
    return statistics.median(out)


def torch_cast(x: Any, fp8: Any, top: float) -> Callable[[], Any]:
    """PyTorch eager: amax, scale, the saturated cast, and the transposed copy."""

    def run() -> Any:
        scale = top / x.abs().amax().float().clamp(min=1e-12)
        q = (x.float() * scale).clamp(-top, top).to(fp8)
        return q, q.t().contiguous(), scale.reciprocal()

    return run


def cast_rows(calls: int, windows: int) -> list[str]:
    import cupy as cp
    import torch

    from rustyflow_py.engine.ops.fp8 import cuda as casts
    from rustyflow_py.engine.ops.fp8.formats import E4M3
    from rustyflow_py.engine.precision import bfloat16

    rows = []
    for name, shape in SHAPES.items():
        x = cp.random.default_rng(0).standard_normal(shape, dtype=np.float32).astype(bfloat16())
        site, replay = cp.zeros(4, np.float32), cp.zeros(1, np.uint32)
        site[:3] = float(cp.abs(x.astype(np.float32)).max())
        delayed = casts.Scaling(site=site, replay=replay)
        moved = x.nbytes * 2  # bf16 read, two layouts of codes written
        tx = torch.as_tensor(x.astype(np.float32), device="cuda").to(torch.bfloat16)
        theirs = torch_us(torch_cast(tx, torch.float8_e4m3fn, 448.0), calls, windows)
        current = median_us(lambda: casts.quantize_both(x, E4M3), calls, windows)  # noqa: B023
        us = median_us(lambda: casts.quantize_both(x, E4M3, delayed), calls, windows)  # noqa: B023
        rows.append(f"| {name} | {shape[0]} x {shape[1]} | {theirs:.1f} | {current:.1f} | "
                    f"{us:.1f} | {moved / us / 1e3:,.0f} |")
    return rows


def gelu_rows(calls: int, windows: int) -> list[str]:
    import cupy as cp

    from rustyflow_py.engine.library import get_backend
    from rustyflow_py.engine.ops.fp8 import cuda as casts
    from rustyflow_py.engine.ops.fp8.formats import E5M2
    from rustyflow_py.engine.precision import bfloat16

    kernels = get_backend("gpu").kernels
    shape = SHAPES["MLP hidden (N, 4E)"]
    rng = cp.random.default_rng(1)
    g, pre = (rng.standard_normal(shape, dtype=np.float32).astype(bfloat16()) for _ in range(2))
    sums = cp.zeros(shape[1], np.float32)
    site, replay = cp.zeros(4, np.float32), cp.zeros(1, np.uint32)
    site[:3] = 4.0
    delayed = casts.Scaling(site=site, replay=replay)

    def apart() -> Any:
        return casts.quantize_both(kernels.gelu_backward(g, pre, None, sums), E5M2, delayed)

    def fused() -> Any:
        q, q_t, part = casts.gelu_backward_codes(g, pre, None, delayed)
        kernels.sum_rows(part, sums)
        return q, q_t

    us_apart, us_fused = median_us(apart, calls, windows), median_us(fused, calls, windows)
    return [f"| GELU backward, then the cast | {us_apart:.1f} | 1.00x |",
            f"| GELU backward writing the codes | {us_fused:.1f} | {us_apart / us_fused:.2f}x |"]


def layernorm_rows(calls: int, windows: int) -> list[str]:
    """The LayerNorm's forward and backward writing their output's codes, each against the
    plain kernel followed by the delayed cast, at x's shape."""
    import cupy as cp

    from rustyflow_py.engine.library import get_backend
    from rustyflow_py.engine.ops.fp8 import cuda as casts
    from rustyflow_py.engine.ops.fp8.formats import E4M3, E5M2
    from rustyflow_py.engine.precision import bfloat16

    kernels = get_backend("gpu").kernels
    shape = SHAPES["x (N, E)"]
    rng = cp.random.default_rng(2)
    x = rng.standard_normal(shape, dtype=np.float32).astype(bfloat16())
    w, b = cp.ones(shape[1], bfloat16()), cp.zeros(shape[1], bfloat16())
    site, replay = cp.zeros(4, np.float32), cp.zeros(1, np.uint32)
    site[:3] = 4.0
    delayed = casts.Scaling(site=site, replay=replay)
    g, res = (rng.standard_normal(shape, dtype=np.float32).astype(bfloat16()) for _ in range(2))
    _, mean, rstd = kernels.layernorm_forward(x, w, b, 1e-5)
    sums = (cp.zeros(shape[1], np.float32), cp.zeros(shape[1], np.float32))
    paths = {  # (forward, backward): apart, then writing the codes
        "apart": (lambda: casts.quantize_both(kernels.layernorm_forward(x, w, b, 1e-5)[0],
                                              E4M3, delayed),
                  lambda: casts.quantize_both(
                      kernels.layernorm_backward(g, x, w, mean, rstd, sums, res)[0], E5M2,
                      delayed)),
        "fused": (lambda: casts.layernorm_forward_codes(x, w, b, 1e-5, delayed),
                  lambda: [kernels.sum_rows(part, into) for part, into in zip(
                      casts.layernorm_backward_codes(g, x, w, mean, rstd, res, delayed)[1:3],
                      sums, strict=True)])}
    rows = []
    for i, name in enumerate(("LayerNorm", "LayerNorm backward (residual joined)")):
        apart, fused = (median_us(paths[k][i], calls, windows) for k in ("apart", "fused"))
        rows += [f"| {name}, then the cast | {apart:.1f} | 1.00x |",
                 f"| {name} writing the codes | {fused:.1f} | {apart / fused:.2f}x |"]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args()

    import cupy as cp

    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    lines = [f"# FP8 casts at GPT-2 124M's shapes, {device}", "",
             "`python benchmarks/fp8_casts.py` (device time per call, us: graphs of "
             f"{args.calls} calls replayed, the median of {args.windows} replays)",
             "", "## The two-layout cast (e4m3)", "",
             "| tensor | shape | PyTorch (graph) | current | delayed | delayed GB/s |",
             "|---|---|---:|---:|---:|---:|",
             *cast_rows(args.calls, args.windows), "",
             "## The MLP's GELU backward and dpre's cast (e5m2, delayed, 16384 x 3072)", "",
             "| path | us | speed-up |", "|---|---:|---:|", *gelu_rows(args.calls, args.windows)]
    from rustyflow_py.engine.ops.fp8 import cuda as casts

    if hasattr(casts, "layernorm_backward_codes"):  # absent in trees before it
        lines += ["", "## LayerNorm and its output's cast (delayed; forward e4m3, backward e5m2; "
                  "16384 x 768)",
                  "", "| path | us | speed-up |", "|---|---:|---:|",
                  *layernorm_rows(args.calls, args.windows)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
