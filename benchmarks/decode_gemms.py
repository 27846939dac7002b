"""The floor of a CPU decode step: one token's weight products of the small model (L6 H6
E384, WikiText-2's 33,278 words, the tied LM head) as bare NumPy calls, with OpenBLAS at one
thread, at THREADS threads set around each call (what the kernel set does for a product of
few rows), and at THREADS threads throughout.

    python benchmarks/decode_gemms.py [--threads N] [--tokens N]

Each token reads all 94 MB of fp32 weights once, so this bounds the decode rate from above
however little the rest of the step costs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rustyflow_py.engine.devices import numpy_blas


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="BLAS threads of the threaded rows")
    ap.add_argument("--tokens", type=int, default=50, help="timed tokens per row")
    args = ap.parse_args()
    found = numpy_blas()
    if found is None:
        raise SystemExit("threadpoolctl finds no BLAS of NumPy's: its threads cannot be set")
    set_threads: Callable[[int], Any] = found.set_num_threads
    rng = np.random.default_rng(0)
    layer = [(384, 1152), (384, 384), (384, 1536), (1536, 384)]  # qkv, proj, fc, fc proj
    weights = [rng.random(shape, dtype=np.float32) for shape in layer * 6]
    head = rng.random((33278, 384), dtype=np.float32)
    rows = {n: rng.random((1, n), dtype=np.float32) for n in (384, 1536)}

    def toggled(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        set_threads(args.threads)
        try:
            return a @ b
        finally:
            set_threads(1)

    def token(product: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
        for w in weights:
            product(rows[w.shape[0]], w)
        product(rows[384], head.T)

    for name, threads, product in (("1 thread", 1, np.matmul),
                                   (f"{args.threads} threads around each call", 1, toggled),
                                   (f"{args.threads} threads throughout", args.threads,
                                    np.matmul)):
        set_threads(threads)
        for _ in range(3):
            token(product)
        start = time.perf_counter()
        for _ in range(args.tokens):
            token(product)
        ms = (time.perf_counter() - start) / args.tokens * 1e3
        print(f"{name}: {ms:.2f} ms a token ({1e3 / ms:,.0f} tokens/s at most)")


if __name__ == "__main__":
    main()
