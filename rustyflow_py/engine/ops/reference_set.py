"""The reference kernel set: every op family's reference kernels composed over `xp` (NumPy
or CuPy), the truth that every backend's faster version is tested against (contract.py
documents each one).

Each returns fresh arrays (or fills `out=` buffers) and keeps float32 inputs in float32:
Python scalars are used as weak scalars so no float64 temporaries appear. 16-bit inputs
(float16) are computed in float32, their accumulation type, and only the results are rounded
back: outputs keep the input's dtype, statistics (mean, rstd, lse, the loss) stay float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..precision import is_16bit
from .attention.reference import AttentionReference
from .batch.reference import BatchReference
from .dropout.reference import DropoutReference
from .embedding.reference import EmbeddingReference
from .gelu.reference import GeluReference
from .gemm.reference import GemmReference
from .layernorm.reference import LayerNormReference
from .optim.reference import OptimizerReference
from .softmax_xent.reference import CrossEntropyReference


class XpKernels(GemmReference, LayerNormReference, GeluReference, AttentionReference,
                CrossEntropyReference, EmbeddingReference, OptimizerReference, BatchReference,
                DropoutReference):
    """The reference formulation; backends override methods with faster equivalents."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.xp = backend.xp
        self._masks: dict[int, Any] = {}


class ReferenceFor16Bit:
    """For a backend whose own kernels are float32/float64 only (the CPU's): first among its
    bases, this sends the kernels that reduce or keep statistics, called on 16-bit arrays, to
    the reference formulation above (float32 inside), and everything else on to the backend.
    The rest (GEMM, scatter-add, cross_entropy_backward, the optimizer on its float32 buffer)
    take 16-bit arrays as they are."""

    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
        if is_16bit(x.dtype):
            return XpKernels.layernorm_forward(self, x, w, b, eps)
        return super().layernorm_forward(x, w, b, eps)

    def layernorm_backward(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any
    ) -> tuple[Any, Any, Any]:
        if is_16bit(x.dtype):
            return XpKernels.layernorm_backward(self, g, x, w, mean, rstd)
        return super().layernorm_backward(g, x, w, mean, rstd)

    def gelu_forward(self, x: Any, bias: Any | None) -> Any:
        if is_16bit(x.dtype):
            return XpKernels.gelu_forward(self, x, bias)
        return super().gelu_forward(x, bias)

    def gelu_backward(self, g: Any, x: Any, bias: Any | None) -> Any:
        if is_16bit(x.dtype):
            return XpKernels.gelu_backward(self, g, x, bias)
        return super().gelu_backward(g, x, bias)

    def causal_softmax_forward(self, scores: Any, scale: float, with_lse: bool = False) -> Any:
        if is_16bit(scores.dtype):
            return XpKernels.causal_softmax_forward(self, scores, scale, with_lse)
        return super().causal_softmax_forward(scores, scale, with_lse)

    def causal_softmax_recompute(self, scores: Any, lse: Any, scale: float) -> Any:
        if is_16bit(scores.dtype):
            return XpKernels.causal_softmax_recompute(self, scores, lse, scale)
        return super().causal_softmax_recompute(scores, lse, scale)

    def causal_softmax_backward(self, g: Any, probs: Any, scale: float) -> Any:
        if is_16bit(probs.dtype):
            return XpKernels.causal_softmax_backward(self, g, probs, scale)
        return super().causal_softmax_backward(g, probs, scale)

    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any]:
        if is_16bit(logits.dtype):
            return XpKernels.cross_entropy(self, logits, targets, need_grad, inplace)
        return super().cross_entropy(logits, targets, need_grad, inplace)

    def lm_head_xent(
        self, h: Any, w: Any, targets: Any, need_grad: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        if is_16bit(h.dtype):
            return XpKernels.lm_head_xent(self, h, w, targets, need_grad, mm)
        return super().lm_head_xent(h, w, targets, need_grad, mm)

    def lm_head_xent_backward(
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        if is_16bit(state[0].dtype):  # the reference's (16-bit d(logits), h, w)
            return XpKernels.lm_head_xent_backward(self, state, g, need_h, need_w, mm)
        return super().lm_head_xent_backward(state, g, need_h, need_w, mm)
