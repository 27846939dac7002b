"""Matrix products as ops: matmul, and the Linear and MLP layers whole, so that a backend
fuses their bias, GELU and bias gradients into the GEMMs."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import Any

from ...autograd import Function, Tensor
from ..elementwise.function import unbroadcast


class MatMul(Function):
    """a @ b for (M,K)@(K,N), batched (...,M,K)@(...,K,N) and (B,T,K)@(K,N).

    transpose_b=True computes a @ b.T without copying b (the tied LM head).
    """

    name = "matmul"
    category = "matmul"
    transpose_b: bool = False

    def forward(self, a: Any, b: Any) -> Any:
        self.a, self.b = a, b
        return self.matmul(a, b, "forward", transpose_b=self.transpose_b)

    def backward(self, grad: Any) -> Sequence[Any]:
        a, b, xp = self.a, self.b, self.xp
        mm = functools.partial(self.matmul, phase="backward")
        bt = xp.swapaxes(b, -1, -2) if self.transpose_b else b  # the (K, N) operand multiplied
        da = db = None
        both = self.needs_input_grad[0] and self.needs_input_grad[1] and bt.ndim == 2
        with self.kernels.shared_gradient(grad) if both else contextlib.nullcontext():
            if self.needs_input_grad[0]:
                da = unbroadcast(mm(grad, bt, transpose_b=True, gradient="a"), a.shape)
            if self.needs_input_grad[1]:
                if bt.ndim == 2 and a.ndim > 2:  # fold the batch into the rows: one GEMM
                    a2 = a.reshape(-1, a.shape[-1])
                    g2 = grad.reshape(-1, grad.shape[-1])
                    db = (mm(g2.T, a2, gradient="a") if self.transpose_b
                          else mm(a2.T, g2, gradient="b"))
                else:
                    dbt = unbroadcast(mm(xp.swapaxes(a, -1, -2), grad, gradient="b"),
                                      bt.shape)
                    db = xp.swapaxes(dbt, -1, -2) if self.transpose_b else dbt
        return da, db


# ---- Linear layers ---------------------------------------------------------------------------
class Linear(Function):
    """y = x @ W + b, (..., K) x (K, N) + (N,), as one op: the backend adds the bias inside
    the GEMM (cuBLASLt's epilogue on the GPU), and adds W's and b's gradients straight into
    their float32 buffers (the weight gradient's GEMM with beta = 1), so none of them is a
    pass of its own. With a fourth input, a residual stream r: y = r + x @ W + b, the add
    inside the GEMM too (its C, beta = 1), and r's gradient is y's, passed on as it is."""

    name = "linear"

    def forward(self, x: Any, w: Any, b: Any, residual: Any = None) -> Any:
        y = self.kernels.linear(x, w, b, False, self.gemm("forward"), residual)[0]
        self.x, self.w = self.kernels.kept_for_backward(x, w)
        return y

    def backward(self, grad: Any) -> Sequence[Any]:
        with self.kernels.shared_gradient(grad):  # read as rows for dx, transposed for dW
            dx = self.matmul(grad, self.w, "backward", transpose_b=True, gradient="a")
            dw, db = self.kernels.linear_grads(self.x, grad, self.gemm("backward"),
                                               self.grad_buffers(1, 2))
        return (dx, dw, db, grad)[: len(self.parents)]


class MLP(Function):
    """The transformer MLP, gelu(x @ W1 + b1) @ W2 + b2, as one op, so the GELU fuses into
    the GEMMs: forward writes the activation and its input from W1's GEMM (cuBLASLt's
    GELU_AUX_BIAS on the GPU); backward multiplies by W2.T, applies the GELU's derivative in
    one element-wise pass, and gets W1's and b1's gradients as a Linear does. (cuBLASLt's
    DGELU_BGRAD epilogue would do the derivative and b1's gradient in the first GEMM, but at
    GPT-2's shapes in bf16 on an H100 it ran them as a separate pass of its own, slower than
    this: benchmarks/results/mlp-dgelu-h100.md.) A sixth input, a residual stream, is
    added in W2's GEMM as a Linear's is."""

    name = "mlp"

    def forward(self, x: Any, w1: Any, b1: Any, w2: Any, b2: Any, residual: Any = None
                ) -> Any:
        gemm, kernels = self.gemm("forward"), self.kernels
        f, self.state = kernels.linear(x, w1, b1, True, gemm)  # (..., 4E)
        self.x, self.w1 = kernels.kept_for_backward(x, w1)
        y = kernels.linear(f, w2, b2, False, gemm, residual)[0]  # (..., E)
        self.f, self.w2 = kernels.kept_for_backward(f, w2)
        return y

    def backward(self, grad: Any) -> Sequence[Any]:
        gemm, kernels = self.gemm("backward"), self.kernels
        w1_into, b1_into = self.grad_buffers(1, 2)
        with kernels.shared_gradient(grad):  # read transposed for dW2, as rows for dpre
            dw2, db2 = kernels.linear_grads(self.f, grad, gemm, self.grad_buffers(3, 4))
            # with a buffer for b1, its gradient comes out of the GELU backward's own pass
            dpre = kernels.linear_dgelu(grad, self.w2, self.state, gemm, b1_into)  # (..., 4E)
        with kernels.shared_gradient(dpre):
            dw1, db1 = kernels.linear_grads(self.x, dpre, gemm, (w1_into, None),
                                            bias=b1_into is None)
            dx = self.matmul(dpre, self.w1, "backward", transpose_b=True, gradient="a")
        dx = dx.reshape(*grad.shape[:-1], dx.shape[-1])  # (..., E): 2-D from FP8 codes of dpre
        return (dx, dw1, db1, dw2, db2, grad)[: len(self.parents)]


def matmul(a: Tensor, b: Tensor, transpose_b: bool = False) -> Tensor:
    return MatMul.apply(a, b, transpose_b=transpose_b)


def linear(x: Tensor, w: Tensor, b: Tensor, residual: Tensor | None = None) -> Tensor:
    """x @ w + b, plus `residual` (..., N) when given (added inside the GEMM where it can)."""
    if residual is None:
        return Linear.apply(x, w, b)
    _check_residual(residual, (*x.shape[:-1], w.shape[-1]), x)
    return Linear.apply(x, w, b, residual)


def mlp(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor,
        residual: Tensor | None = None) -> Tensor:
    """gelu(x @ w1 + b1) @ w2 + b2, plus `residual` (..., E) when given (added inside the
    second GEMM where it can)."""
    if residual is None:
        return MLP.apply(x, w1, b1, w2, b2)
    _check_residual(residual, (*x.shape[:-1], w2.shape[-1]), x)
    return MLP.apply(x, w1, b1, w2, b2, residual)


def _check_residual(residual: Tensor, shape: tuple[int, ...], x: Tensor) -> None:
    """A residual is added as it is and gets the output's gradient as it is: it must have the
    output's shape and dtype (no broadcasting, no casting)."""
    if residual.shape != shape or residual.dtype != x.dtype:
        raise ValueError(f"residual of shape {residual.shape} and dtype {residual.dtype}: it "
                         f"must match the layer's output, {shape} {x.dtype}")

