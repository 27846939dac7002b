"""CPU GELU (tanh approximation) as x * sigmoid(2u), u = c (x + k x^3): one exp instead of a
slower tanh, in cache blocks of rows with the bias add fused in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..cpu_pool import BLOCK, Blocks
from .reference import GELU_C, GELU_K, GeluReference


class CpuGelu(GeluReference):
    uses = ("_parallel", "_jit_for", "jit")

    def _gelu_pass(self, x: Any, bias: Any | None, fn: Callable[..., None], *others: Any,
                   jit_fn: Callable[..., None] | None = None) -> Any:
        """Run fn(z, out, *other_blocks, scratch) over cache blocks of rows, z = x (+ bias);
        with jit_fn (numba, float32), jit_fn(*other_blocks, x_block, bias, out) instead."""
        c = x.shape[-1]
        x2 = x.reshape(-1, c)
        rest = [o.reshape(-1, c) for o in others]
        out = np.empty_like(x2)
        rows = max(1, BLOCK // c)
        if self._jit_for(x2, *rest, *([] if bias is None else [bias])) is None:
            jit_fn = None

        def worker(blocks: Blocks) -> None:
            scratch = None if jit_fn is not None else np.empty((3, rows, c), x.dtype)
            with np.errstate(over="ignore"):  # exp(-2u) -> inf for very negative z: GELU -> 0
                for i, j in blocks:
                    if jit_fn is not None:
                        jit_fn(*(r[i:j] for r in rest), x2[i:j], bias, out[i:j])
                        continue
                    z = x2[i:j]
                    if bias is not None:
                        z = np.add(z, bias, out=out[i:j])
                    fn(z, out[i:j], *(r[i:j] for r in rest), *scratch[:, : j - i])

        self._parallel(worker, x2.shape[0], rows, x2.size)
        return out.reshape(x.shape)

    def gelu_forward(self, x: Any, bias: Any | None) -> Any:
        def fwd(z: Any, out: Any, t: Any, *_: Any) -> None:
            np.multiply(z, z, out=t)
            t *= -2.0 * GELU_C * GELU_K
            t -= 2.0 * GELU_C
            t *= z  # -2u, u = c (z + k z^3)
            np.exp(t, out=t)
            t += 1.0
            np.divide(z, t, out=out)  # z * sigmoid(2u) = 0.5 z (1 + tanh u)

        jit_fn = None if self.jit is None else self.jit.gelu.gelu_forward
        return self._gelu_pass(x, bias, fwd, jit_fn=jit_fn)

    def _gelu_backward(self, g: Any, x: Any, bias: Any | None) -> Any:
        def bwd(z: Any, out: Any, gb: Any, z2: Any, sig: Any, tmp: Any) -> None:
            np.multiply(z, z, out=z2)
            np.multiply(z2, -2.0 * GELU_C * GELU_K, out=sig)
            sig -= 2.0 * GELU_C
            sig *= z
            np.exp(sig, out=sig)
            sig += 1.0
            np.reciprocal(sig, out=sig)  # sigmoid(2u)
            np.subtract(1.0, sig, out=tmp)
            z2 *= 6.0 * GELU_C * GELU_K
            z2 += 2.0 * GELU_C  # 2 du/dz
            z2 *= z
            z2 *= sig
            z2 *= tmp
            z2 += sig  # d/dz z sigmoid(2u) = s + z s (1 - s) 2 du/dz
            np.multiply(z2, gb, out=out)

        jit_fn = None if self.jit is None else self.jit.gelu.gelu_backward
        return self._gelu_pass(x, bias, bwd, g, jit_fn=jit_fn)
