"""FP8 against bf16 GEMMs at GPT-2 124M's shapes: the ceiling of what FP8 can give a step.

For each Linear of a block and the LM head, the three GEMMs of a training step (forward
x @ W^T, the input gradient dy @ W, the weight gradient dy^T @ x), each in the "TN" layout
FP8 takes (both operands K-contiguous), timed as:
  - bf16: RustyFlow's cuBLASLt call (`CublasLt.matmul_into`, what the bf16 step runs);
  - fp8: `CublasLt.matmul_fp8` (e4m3 activations and weights, e5m2 gradients, bf16 out),
    with and without FAST_ACCUM (each problem's plan keeps the fastest candidate algorithm,
    timed at its first call);
  - the named peer: PyTorch's `torch._scaled_mm` on the same FP8 operands, and its bf16
    `torch.mm`.
Then the cost of one current-scaling cast (`fp8.cuda.quantize`, amax + codes) of each GEMM's
first operand from bf16 (x, dy, dy^T: about the activation casts a step needs, less the
transposed x of the weight gradient), and the sums over a step (12 blocks + the LM head), so
the gain the GEMMs can give is set against what unfused casts take. Device time from CUDA
events, median of windows.

    python benchmarks/fp8_gemm.py --batch 16 --seq 1024 --out fp8-gemm.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from layernorm_bwd import CupyEvent, TorchEvent, time_calls  # noqa: E402

from rustyflow_py.reporting.text import markdown  # noqa: E402

E, VOCAB, LAYERS = 768, 50304, 12
# (name, in features K, out features N, per step): the block's four Linears and the LM head
LINEARS = [("qkv", E, 3 * E, LAYERS), ("attn proj", E, E, LAYERS), ("fc", E, 4 * E, LAYERS),
           ("mlp proj", 4 * E, E, LAYERS), ("lm head", E, VOCAB, 1)]


def gemms(m: int, k: int, n: int) -> list[tuple[str, int, int, int, str, str]]:
    """(pass, rows, cols, inner, format of a, format of b) of out (rows, cols) = a @ b^T for
    a Linear of M tokens, K in and N out features."""
    return [("fwd", m, n, k, "e4m3", "e4m3"), ("dgrad", m, k, n, "e5m2", "e4m3"),
            ("wgrad", n, k, m, "e5m2", "e4m3")]


def gemm_args(doc: str) -> argparse.Namespace:
    """The options of a GEMM benchmark at GPT-2's shapes (this one and gemm_algos.py)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def open_lt() -> tuple[Any, Any]:
    """(the GPU backend, a CublasLt on its stream, made current), as the trainer has them."""
    import cupy

    from rustyflow_py.engine.library import get_backend
    from rustyflow_py.engine.ops.gemm.cublaslt import CublasLt

    backend = get_backend("gpu")
    backend.stream.use()
    return backend, CublasLt(cupy, backend.stream)


def main() -> None:
    args = gemm_args(__doc__)

    import cupy
    import torch

    from rustyflow_py.engine.ops.fp8 import cuda as fp8
    from rustyflow_py.engine.ops.fp8.formats import FORMATS

    backend, lt = open_lt()
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    m = args.batch * args.seq
    rng = np.random.default_rng(0)
    t = lambda fn, ev: time_calls(fn, ev, args.calls, args.windows)  # noqa: E731
    rows, totals = [], np.zeros(6)
    for name, k_in, n_out, count in LINEARS:
        for pass_, r, c, inner, fa, fb in gemms(m, k_in, n_out):
            a = cupy.asarray(rng.standard_normal((r, inner), dtype=np.float32)).astype(bf16)
            b = cupy.asarray(rng.standard_normal((c, inner), dtype=np.float32)).astype(bf16)
            out = cupy.empty((r, c), bf16)
            qa, qb = fp8.quantize(a, FORMATS[fa]), fp8.quantize(b, FORMATS[fb])
            times = [t(lambda: lt.matmul_into(a, b.T, out), CupyEvent),  # noqa: B023
                     t(lambda: lt.matmul_fp8(qa, qb, out), CupyEvent),  # noqa: B023
                     t(lambda: lt.matmul_fp8(qa, qb, out, fast_accum=True),  # noqa: B023
                       CupyEvent),
                     t(lambda: fp8.quantize(a, FORMATS[fa]), CupyEvent)]  # noqa: B023
            ta = torch.as_tensor(a.view(np.int16), device="cuda").view(torch.bfloat16)
            tb = torch.as_tensor(b.view(np.int16), device="cuda").view(torch.bfloat16)
            tqa = torch.as_tensor(qa.codes, device="cuda").view(
                torch.float8_e4m3fn if fa == "e4m3" else torch.float8_e5m2)
            tqb = torch.as_tensor(qb.codes, device="cuda").view(
                torch.float8_e4m3fn if fb == "e4m3" else torch.float8_e5m2)
            sa, sb = (torch.as_tensor(q.scale_inv, device="cuda").reshape(()) for q in (qa, qb))
            backend.stream.synchronize()  # the operands are ready before PyTorch reads them
            times += [t(lambda: torch.mm(ta, tb.t()), TorchEvent),  # noqa: B023
                      t(lambda: torch._scaled_mm(tqa, tqb.t(), sa, sb,  # noqa: B023
                                                 out_dtype=torch.bfloat16,
                                                 use_fast_accum=True), TorchEvent)]
            flops = 2 * r * c * inner
            totals += np.array(times) * count
            rows.append([name, pass_, f"{r}x{inner} @ {inner}x{c}", f"{fa}x{fb}",
                         *(f"{x:.1f}" for x in times[:4]), f"{times[0] / times[1]:.2f}x",
                         f"{times[0] / times[2]:.2f}x", f"{flops / times[1] / 1e6:.0f}",
                         f"{times[4]:.1f}", f"{times[5]:.1f}"])
            print(" | ".join(rows[-1]), flush=True)
    rows.append(["step", f"sum x{LAYERS} blocks + head", "", "",
                 *(f"{x / 1e3:.2f} ms" for x in totals[:4]), f"{totals[0] / totals[1]:.2f}x",
                 f"{totals[0] / totals[2]:.2f}x", "", f"{totals[4] / 1e3:.2f} ms",
                 f"{totals[5] / 1e3:.2f} ms"])
    head = ["linear", "GEMM", "shape", "fp8 formats", "bf16 us", "fp8 us", "fp8 fast us",
            "cast a us", "fp8 speed-up", "fp8 fast speed-up", "fp8 TFLOP/s", "torch bf16 us",
            "torch fp8 fast us"]
    report(f"{torch.cuda.get_device_name()}, M = {args.batch} x {args.seq} tokens, bf16 out",
           markdown(head, rows, set(range(4, 13))), args.out)
    lt.close()


def report(title: str, table: list[str], out: Path | None) -> None:
    """The title and the table, printed and written to `out` when given."""
    text = "\n".join([title, "", *table]) + "\n"
    print(text)
    if out:
        out.write_text(text)


if __name__ == "__main__":
    main()
