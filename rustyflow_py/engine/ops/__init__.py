"""The op library, one folder per op family: each holds the op's autograd Function(s) and
functional wrapper (function.py), its reference kernel (the array-API ground truth,
reference.py), its CPU kernel (cpu.py) and its CUDA launchers (cuda.py) with their CUDA C in
.cu files beside them. This package re-exports the functional API the model calls
(`ops.linear(x, w, b)`, `ops.layer_norm(x, w, b)`, ...) and the Function classes.

Contract for every op: `forward` takes and returns raw arrays of the tensor's backend;
`backward` returns one gradient (or None) per input and never modifies `grad` in place
(the same gradient array may be handed to several inputs).
"""

from __future__ import annotations

from ..autograd import Tensor
from .attention.function import (
    CachedAttention,
    CausalSelfAttention,
    cached_attention,
    causal_self_attention,
)
from .dropout.function import Dropout, Randomness, dropout, randomness, word_dropout
from .elementwise.function import Add, Mul, ScalarAdd, ScalarMul, _sub, add, mul, unbroadcast
from .embedding.function import Embedding, embedding
from .gelu.function import Gelu, gelu
from .gemm.function import MLP, Linear, MatMul, linear, matmul, mlp
from .layernorm.function import LayerNorm, layer_norm
from .shape.function import (
    Index,
    Reshape,
    Sum,
    Transpose,
    _reshape,
    _transpose,
    index,
    mean,
    reshape,
    split,
    sum,
    transpose,
)
from .softmax_xent.function import (
    CrossEntropy,
    LMHeadCrossEntropy,
    cross_entropy,
    lm_head_cross_entropy,
)

__all__ = [
    "MLP", "Add", "CachedAttention", "CausalSelfAttention", "CrossEntropy", "Dropout",
    "Embedding", "Gelu", "Index", "LMHeadCrossEntropy", "LayerNorm", "Linear", "MatMul", "Mul",
    "Randomness", "Reshape", "ScalarAdd", "ScalarMul", "Sum", "Transpose", "add",
    "bind_operators", "cached_attention", "causal_self_attention", "cross_entropy", "dropout",
    "embedding", "gelu", "index", "layer_norm", "linear", "lm_head_cross_entropy", "matmul",
    "mean", "mlp", "mul", "randomness", "reshape", "split", "sum", "transpose", "unbroadcast",
    "word_dropout",
]


def bind_operators(cls: type[Tensor]) -> None:
    """Give Tensor its operators (a + b, a * b, a - b, -a, a @ b, .reshape, .transpose,
    .sum, .mean): called once by tensor.py, the module users import Tensor from."""
    cls.__add__ = cls.__radd__ = add  # type: ignore[method-assign,assignment]
    cls.__mul__ = cls.__rmul__ = mul  # type: ignore[method-assign,assignment]
    cls.__sub__ = _sub  # type: ignore[method-assign,assignment]
    cls.__neg__ = lambda x: mul(x, -1.0)  # type: ignore[method-assign,assignment]
    cls.__matmul__ = matmul  # type: ignore[method-assign,assignment]
    cls.reshape = _reshape  # type: ignore[attr-defined]
    cls.transpose = _transpose  # type: ignore[attr-defined]
    cls.sum = sum  # type: ignore[attr-defined]
    cls.mean = mean  # type: ignore[attr-defined]
