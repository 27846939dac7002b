"""LayerNorm's backward on the GPU against PyTorch's, at the model's shapes.

Times the very call a training step makes (`backend.kernels.layernorm_backward`: dx with the
residual gradient joined, and dw, db summed into float32 gradient buffers) and PyTorch's
`aten.native_layer_norm_backward` on the same inputs (without the residual join, which PyTorch
does in a separate add: timed apart, and added in the PyTorch+add column). Device time per call
from CUDA events over many calls, median of windows. The flags sweep layernorm/cuda.py's
settings (KNOBS below), every combination of the values given: `--warps` (LN_BWD_WARPS, how
many rows each warp of the register-row kernel takes), `--block-warps` (its warps a block)
and `--ahead` (whether its next row's loads go ahead of this row's sums: 1 for float32 and
16 bits, 0 for none).

    python benchmarks/layernorm_bwd.py --rows 16384 --cols 768 --dtypes bf16,fp32 \
        --warps 1024,1536 --block-warps 4,8
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np


def time_calls(fn: Any, event: Any, calls: int, windows: int) -> float:
    """Median over windows of the device time per call, in microseconds; `event()` makes a
    timing event on the stream `fn` launches on (CuPy's current one, or PyTorch's), whose
    `since(start)` is the milliseconds from `start`."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(windows):
        start, stop = event(), event()
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        out.append(stop.since(start) * 1e3 / calls)
    return statistics.median(out)


class CupyEvent:
    def __init__(self) -> None:
        import cupy

        self.cupy, self.event = cupy, cupy.cuda.Event()
        self.record, self.synchronize = self.event.record, self.event.synchronize

    def since(self, start: CupyEvent) -> float:
        return self.cupy.cuda.get_elapsed_time(start.event, self.event)


class TorchEvent:
    def __init__(self) -> None:
        import torch

        self.event = torch.cuda.Event(enable_timing=True)
        self.record, self.synchronize = self.event.record, self.event.synchronize

    def since(self, start: TorchEvent) -> float:
        return start.event.elapsed_time(self.event)


def one_dtype(name: str, n: int, c: int, sweep: list[dict[str, Any]], calls: int,
              windows: int) -> None:
    """The table's rows of one dtype: ours at each setting of the sweep (layernorm/cuda.py's
    module constants by name), PyTorch's beside."""
    import cupy as cp
    import torch

    from rustyflow_py.engine.library import get_backend
    from rustyflow_py.engine.ops.layernorm import cuda as ln_cuda
    from rustyflow_py.engine.precision import bfloat16

    kernels = get_backend("gpu").kernels
    dtype = {"bf16": bfloat16(), "fp32": np.dtype(np.float32), "fp64": np.dtype(np.float64)}[name]
    rng = cp.random.default_rng(0)
    x, g, res = (rng.standard_normal((n, c), dtype=np.float32).astype(dtype) for _ in range(3))
    w = (1 + 0.1 * rng.standard_normal(c, dtype=np.float32)).astype(dtype)
    _, mean, rstd = kernels.layernorm_forward(x, w, cp.zeros(c, dtype=dtype), 1e-5)
    dw, db = cp.zeros(c, np.float32), cp.zeros(c, np.float32)
    tdt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}[name]
    tx, tg, tres, tw = (torch.as_tensor(a.astype(np.float32), device="cuda").to(tdt)
                        for a in (x, g, res, w))
    tb = torch.zeros_like(tw)
    _, tmean, trstd = torch.ops.aten.native_layer_norm(tx, [c], tw, tb, 1e-5)

    def theirs() -> Any:
        return torch.ops.aten.native_layer_norm_backward(tg, tx, [c], tmean, trstd, tw, tb,
                                                         [True, True, True])

    torch_us = time_calls(theirs, TorchEvent, calls, windows)
    torch_add_us = time_calls(lambda: theirs()[0] + tres, TorchEvent, calls, windows)
    moved = x.nbytes * 4  # g, x and the residual read, dx written
    own = {k: getattr(ln_cuda, k) for k in KNOBS.values()}
    for setting in sweep:
        for key, value in setting.items():
            setattr(ln_cuda, key, value)
        us = time_calls(lambda: kernels.layernorm_backward(g, x, w, mean, rstd, (dw, db), res),
                        CupyEvent, calls, windows)
        shown = ", ".join(f"{k}={_shown(v)}" for k, v in setting.items()) or "its own"
        print(f"| {name} | {shown} | {us:.1f} | {moved / us / 1e3:,.0f} | {torch_us:.1f} | "
              f"{torch_add_us:.1f} | {us / torch_add_us:.2f} |")
        for key, value in own.items():
            setattr(ln_cuda, key, value)


def _shown(value: Any) -> str:
    """A setting as the table prints it: an itemsize set as "2/4" (or "none")."""
    if isinstance(value, frozenset):
        return "/".join(map(str, sorted(value))) or "none"
    return str(value)


# each flag: the layernorm/cuda.py constant it sets (values: comma-separated; the itemsize
# sets as 0 = none, 1 = float32 and 16 bits)
KNOBS = {"warps": "LN_BWD_WARPS", "block_warps": "LN_BWD_BLOCK_WARPS",
         "ahead": "LN_AHEAD_ITEMSIZES"}
SETS = {"ahead"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--cols", type=int, default=768)
    p.add_argument("--dtypes", default="bf16,fp32")
    for flag, const in KNOBS.items():
        p.add_argument(f"--{flag.replace('_', '-')}", default="",
                       help=f"comma-separated values of {const} to sweep")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--windows", type=int, default=5)
    args = p.parse_args()

    import itertools

    import cupy as cp

    axes = []
    for flag, const in KNOBS.items():
        values = [int(v) for v in getattr(args, flag).split(",") if v]
        if flag in SETS:
            axes.append([(const, frozenset({2, 4} if v else ())) for v in values])
        else:
            axes.append([(const, v) for v in values])
    sweep = [dict(c) for c in itertools.product(*[a for a in axes if a])]
    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"LayerNorm backward, {args.rows} x {args.cols}, {device}")
    print("| dtype | setting | rustyflow us | rustyflow GB/s | torch us | torch + add us | "
          "ratio vs torch + add |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.dtypes.split(","):
        one_dtype(name, args.rows, args.cols, sweep, args.calls, args.windows)


if __name__ == "__main__":
    main()
