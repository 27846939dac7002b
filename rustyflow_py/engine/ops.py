"""The op library: one Function subclass per op, plus the functional wrappers models call.

Contract for every op: `forward` takes and returns raw arrays of the tensor's backend;
`backward` returns one gradient (or None) per input and never modifies `grad` in place
(the same gradient array may be handed to several inputs).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

from .autograd import Function, RowGrad, Tensor, grad_enabled


def unbroadcast(grad: Any, shape: tuple[int, ...], kernels: Any = None) -> Any:
    """Sum `grad` down to `shape`, undoing NumPy broadcasting (a bias: fused column sums)."""
    if kernels is not None and len(shape) == 1 and grad.ndim >= 2 and grad.shape[-1] == shape[0]:
        return kernels.sum_rows(grad.reshape(-1, shape[0]))
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad


# ---- elementwise --------------------------------------------------------------------------
class Add(Function):
    name = "add"

    def forward(self, a: Any, b: Any) -> Any:
        self.shapes = (a.shape, b.shape)
        return a + b

    def backward(self, grad: Any) -> Sequence[Any]:
        return (unbroadcast(grad, self.shapes[0], self.kernels),
                unbroadcast(grad, self.shapes[1], self.kernels))


class Mul(Function):
    name = "mul"

    def forward(self, a: Any, b: Any) -> Any:
        self.a, self.b = a, b
        return a * b

    def backward(self, grad: Any) -> Sequence[Any]:
        da = unbroadcast(grad * self.b, self.a.shape) if self.needs_input_grad[0] else None
        db = unbroadcast(grad * self.a, self.b.shape) if self.needs_input_grad[1] else None
        return da, db


class ScalarAdd(Function):
    """x + c for a Python number c (no device copy of the constant)."""

    name = "add"
    c: float

    def forward(self, x: Any) -> Any:
        return x + self.c

    def backward(self, grad: Any) -> Sequence[Any]:
        return (grad,)


class ScalarMul(Function):
    name = "mul"
    c: float

    def forward(self, x: Any) -> Any:
        return x * self.c

    def backward(self, grad: Any) -> Sequence[Any]:
        return (grad * self.c,)


@dataclasses.dataclass(frozen=True)
class Randomness:
    """Where a model's dropout masks come from: the run's seed and the step counter, a 0-d
    int32 device array read by the mask kernel itself (a replayed graph draws fresh masks).
    Each call site adds its own stream id, so no two sites share a mask; so does each `shard`
    of a step's batch (a data-parallel rank, an accumulation micro-step), unless the mask is
    one for the whole step (whole-word dropout drops the same words everywhere)."""

    seed: int
    step: Any
    shard: int = 0

    def stream(self, site: int, per_shard: bool = True) -> int:
        """The Philox key word of a call site (and of this shard, unless one mask serves
        the whole step)."""
        return site + (self.shard << 20 if per_shard else 0)

    def mask(self, kernels: Any, shape: tuple[int, ...], dtype: Any, p: float,
             site: int, per_shard: bool = True) -> Any:
        """1/(1-p) where kept, 0 where dropped (kernels.dropout_mask)."""
        return kernels.dropout_mask(shape, dtype, p, self.seed, self.stream(site, per_shard),
                                    self.step)

    def apply(self, kernels: Any, x: Any, p: float, site: int) -> Any:
        """x times this step's mask of `site` (kernels.dropout_apply: no mask array)."""
        return kernels.dropout_apply(x, p, self.seed, self.stream(site), self.step)


class Dropout(Function):
    """Inverted dropout: zero with probability p, scale survivors by 1/(1-p)."""

    name = "dropout"
    p: float
    rng: Randomness
    site: int

    def forward(self, x: Any) -> Any:
        return self.rng.apply(self.kernels, x, self.p, self.site)

    def backward(self, grad: Any) -> Sequence[Any]:
        """The same mask again (same seed, site, step and element order): none is kept."""
        return (self.rng.apply(self.kernels, grad, self.p, self.site),)


class Gelu(Function):
    """GELU, tanh approximation; with a second input, bias + GELU fused."""

    name = "gelu"

    def forward(self, x: Any, bias: Any = None) -> Any:
        self.x, self.bias = x, bias
        return self.kernels.gelu_forward(x, bias)

    def backward(self, grad: Any) -> Sequence[Any]:
        dx = self.kernels.gelu_backward(grad, self.x, self.bias)
        if self.bias is None:
            return (dx,)
        return dx, self.kernels.sum_rows(dx.reshape(-1, dx.shape[-1]))


# ---- matmul ----------------------------------------------------------------------------------
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
        if self.needs_input_grad[0]:
            da = unbroadcast(mm(grad, bt, transpose_b=True), a.shape)
        if self.needs_input_grad[1]:
            if bt.ndim == 2 and a.ndim > 2:  # fold the batch into the rows: one GEMM
                a2 = a.reshape(-1, a.shape[-1])
                g2 = grad.reshape(-1, grad.shape[-1])
                db = mm(g2.T, a2) if self.transpose_b else mm(a2.T, g2)
            else:
                dbt = unbroadcast(mm(xp.swapaxes(a, -1, -2), grad), bt.shape)
                db = xp.swapaxes(dbt, -1, -2) if self.transpose_b else dbt
        return da, db


# ---- Linear layers ---------------------------------------------------------------------------
class Linear(Function):
    """y = x @ W + b, (..., K) x (K, N) + (N,), as one op: the backend adds the bias inside
    the GEMM (cuBLASLt's epilogue on the GPU) and gets the bias gradient from the weight
    gradient's GEMM, so neither is a pass of its own over an activation-sized array."""

    name = "linear"

    def forward(self, x: Any, w: Any, b: Any) -> Any:
        self.x, self.w = x, w
        return self.kernels.linear(x, w, b, False, self.gemm("forward"))[0]

    def backward(self, grad: Any) -> Sequence[Any]:
        dx = self.matmul(grad, self.w, "backward", transpose_b=True)
        dw, db = self.kernels.linear_grads(self.x, grad, self.gemm("backward"))
        return dx, dw, db


class MLP(Function):
    """The transformer MLP, gelu(x @ W1 + b1) @ W2 + b2, as one op, so the GELU fuses into
    the GEMMs on both sides: forward writes the activation and its input from W1's GEMM, and
    backward gets d(pre-activation) and b1's gradient from the epilogue of the GEMM that
    multiplies by W2.T (cuBLASLt's GELU_AUX_BIAS and DGELU_BGRAD on the GPU)."""

    name = "mlp"

    def forward(self, x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
        gemm = self.gemm("forward")
        f, self.state = self.kernels.linear(x, w1, b1, True, gemm)  # (..., 4E)
        self.x, self.f, self.w1, self.w2 = x, f, w1, w2
        return self.kernels.linear(f, w2, b2, False, gemm)[0]  # (..., E)

    def backward(self, grad: Any) -> Sequence[Any]:
        gemm = self.gemm("backward")
        dw2, db2 = self.kernels.linear_grads(self.f, grad, gemm)
        dpre, db1 = self.kernels.linear_dgelu(grad, self.w2, self.state, gemm)  # (..., 4E)
        x2 = self.x.reshape(-1, self.x.shape[-1])
        dw1 = self.matmul(x2.T, dpre.reshape(-1, dpre.shape[-1]), "backward")
        dx = self.matmul(dpre, self.w1, "backward", transpose_b=True)
        return dx, dw1, db1, dw2, db2


# ---- shape ops -------------------------------------------------------------------------------
class Reshape(Function):
    name = "reshape"
    shape: tuple[int, ...]

    def forward(self, x: Any) -> Any:
        self.in_shape = x.shape
        return x.reshape(self.shape)

    def backward(self, grad: Any) -> Sequence[Any]:
        return (grad.reshape(self.in_shape),)


class Transpose(Function):
    name = "transpose"
    axes: tuple[int, ...] | None

    def forward(self, x: Any) -> Any:
        self.axes = self.axes or tuple(reversed(range(x.ndim)))
        return x.transpose(self.axes)

    def backward(self, grad: Any) -> Sequence[Any]:
        inverse = [0] * len(self.axes)
        for i, a in enumerate(self.axes):
            inverse[a] = i
        return (grad.transpose(inverse),)


class Index(Function):
    """x[key] for basic (slice/int) indexing; backward scatters into zeros."""

    name = "index"
    key: Any

    def forward(self, x: Any) -> Any:
        self.in_shape, self.in_dtype = x.shape, x.dtype
        return x[self.key]

    def backward(self, grad: Any) -> Sequence[Any]:
        dx = self.xp.zeros(self.in_shape, dtype=self.in_dtype)
        dx[self.key] = grad
        return (dx,)


class Sum(Function):
    name = "sum"
    axis: int | tuple[int, ...] | None
    keepdims: bool

    def forward(self, x: Any) -> Any:
        self.in_shape = x.shape
        return x.sum(axis=self.axis, keepdims=self.keepdims)

    def backward(self, grad: Any) -> Sequence[Any]:
        if not self.keepdims and self.axis is not None:
            axes = (self.axis,) if isinstance(self.axis, int) else self.axis
            grad = self.xp.expand_dims(grad, tuple(a % len(self.in_shape) for a in axes))
        return (self.xp.broadcast_to(grad, self.in_shape),)


# ---- model ops -------------------------------------------------------------------------------
class Embedding(Function):
    """weight[idx]; the gradient is row-sparse: a RowGrad, scatter-added into weight.grad."""

    name = "embedding"

    def forward(self, weight: Any, idx: Any) -> Any:
        self.idx, self.shape = idx, weight.shape
        return weight[idx]

    def backward(self, grad: Any) -> Sequence[Any]:
        return RowGrad(self.idx, grad, self.shape, self.kernels), None


class LayerNorm(Function):
    name = "layernorm"
    eps: float

    def forward(self, x: Any, w: Any, b: Any) -> Any:
        y, self.mean, self.rstd = self.kernels.layernorm_forward(x, w, b, self.eps)
        self.x, self.w = x, w
        return y

    def backward(self, grad: Any) -> Sequence[Any]:
        return self.kernels.layernorm_backward(grad, self.x, self.w, self.mean, self.rstd)


class CausalSelfAttention(Function):
    """Causal multi-head attention core on a fused QKV tensor: (B, T, 3E) -> (B, T, E).

    Where the backend has a fused kernel for the dtype and head size (the GPU's flash-style
    attention: tf32 and 16-bit runs), the whole op is that kernel and T x T is never formed;
    its matrix products are then timed inside "attention", not as matmuls. Otherwise it is
    materialised: scale, mask and softmax are one fused kernel, and the batched matmuls are
    timed as matmuls of their own. At long sequence lengths the (B, H, T, T) probabilities
    would dominate activation memory, so when they outweigh a quarter of a block's other
    activations (H*T > 6*E) only each row's log-sum-exp is kept and backward recomputes them
    with one more matmul; below that they are kept, which is faster.
    """

    name = "attention"
    n_head: int
    dropout: float = 0.0
    rng: Randomness | None = None
    site: int = 0

    def _heads(self, qkv: Any) -> tuple[Any, Any, Any]:
        """q, k, v as contiguous (B, H, T, D): each matmul is one strided-batched GEMM."""
        b, t, e3 = qkv.shape
        h = self.n_head
        split = qkv.reshape(b, t, 3, h, e3 // 3 // h).transpose(2, 0, 3, 1, 4)
        return tuple(self.xp.ascontiguousarray(z) for z in split)  # type: ignore[return-value]

    def _probs(self, q: Any, k: Any, phase: str) -> Any:
        att = self.matmul(q, self.xp.swapaxes(k, -1, -2), phase)  # (B, H, T, T)
        if phase == "forward":
            probs, self.lse = self.kernels.causal_softmax_forward(att, self.scale, True)
            return probs
        return self.kernels.causal_softmax_recompute(att, self.lse, self.scale)

    def _head_views(self, x: Any) -> list[Any]:
        """The (B, H, T, D) views of q, k, v inside a packed (B, T, 3E) array: no copies."""
        b, t, e3 = x.shape
        h = self.n_head
        split = x.reshape(b, t, 3, h, e3 // 3 // h)
        return [split[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]

    def _fused_forward(self, qkv: Any) -> Any:
        """The fused kernel reads the heads in place and writes y (B, T, H, D), the (B, T, E)
        output, through its head-major view: no split or merge copies."""
        b, t, e3 = qkv.shape
        q, k, v = self._head_views(qkv)
        y = self.xp.empty((b, t, self.n_head, e3 // 3 // self.n_head), dtype=qkv.dtype)
        _, self.lse = self.kernels.attention_forward(q, k, v, self.scale, self._mask(),
                                                     out=y.transpose(0, 2, 1, 3))
        self.qkv, self.y = qkv, y
        return y.reshape(b, t, e3 // 3)  # (B, T, E)

    def _fused_backward(self, grad: Any) -> Any:
        b, t, e = grad.shape
        y, h = self.y, self.n_head
        dqkv = self.xp.empty((b, t, 3 * e), dtype=grad.dtype)
        gy = self.xp.ascontiguousarray(grad).reshape(b, t, h, e // h).transpose(0, 2, 1, 3)
        self.kernels.attention_backward(*self._head_views(self.qkv), y.transpose(0, 2, 1, 3),
                                        gy, self.lse, self.scale, self._mask(),
                                        out=self._head_views(dqkv))
        return dqkv  # (B, T, 3E)

    def _mask(self) -> tuple[float, int, int, Any] | None:
        """The fused kernel's dropout: the (p, seed, stream, step) dropout_mask would take."""
        if not self.dropped:
            return None
        assert self.rng is not None
        return self.dropout, self.rng.seed, self.rng.stream(self.site), self.rng.step

    def _drop(self, x: Any) -> Any:
        """x (B, H, T, T) times the probabilities' dropout mask, drawn inline."""
        assert self.rng is not None
        return self.rng.apply(self.kernels, x, self.dropout, self.site)

    def _recompute(self, qkv: Any) -> bool:
        _, t, e3 = qkv.shape
        return self.n_head * t > 2 * e3  # H*T > 6*E

    def forward(self, qkv: Any) -> Any:
        b, t, e3 = qkv.shape
        d = e3 // 3 // self.n_head
        self.scale = 1.0 / math.sqrt(d)
        self.dropped = self.dropout > 0.0 and self.rng is not None
        self.fused = self.kernels.fused_attention(qkv.dtype, d, t)
        if self.fused:  # one kernel, T x T never formed; backward recomputes from the lse
            return self._fused_forward(qkv)
        q, k, v = self._heads(qkv)
        probs = used = self._probs(q, k, "forward")
        if self.dropped:
            used = self._drop(probs)
        y = self.matmul(used, v, "forward")  # (B, H, T, D)
        self.qkv = qkv
        self.saved = None if self._recompute(qkv) else (q, k, v, probs, used)
        return y.transpose(0, 2, 1, 3).reshape(b, t, e3 // 3)  # (B, T, E)

    def backward(self, grad: Any) -> Sequence[Any]:
        xp, phase = self.xp, "backward"
        if self.fused:
            return (self._fused_backward(grad),)
        if self.saved is None:
            q, k, v = self._heads(self.qkv)
            probs = self._probs(q, k, phase)
            used = self._drop(probs) if self.dropped else probs
        else:
            q, k, v, probs, used = self.saved
        b, h, t, d = q.shape
        gy = xp.ascontiguousarray(grad.reshape(b, t, h, d).transpose(0, 2, 1, 3))  # (B,H,T,D)
        dqkv = xp.empty((b, t, 3, h, d), dtype=grad.dtype)
        dqkv[:, :, 2] = self.matmul(xp.swapaxes(used, -1, -2), gy, phase).transpose(0, 2, 1, 3)
        dused = self.matmul(gy, xp.swapaxes(v, -1, -2), phase)  # (B, H, T, T)
        if self.dropped:
            dused = self._drop(dused)
        datt = self.kernels.causal_softmax_backward(dused, probs, self.scale)
        dqkv[:, :, 0] = self.matmul(datt, k, phase).transpose(0, 2, 1, 3)
        dqkv[:, :, 1] = self.matmul(xp.swapaxes(datt, -1, -2), q, phase).transpose(0, 2, 1, 3)
        return (dqkv.reshape(b, t, 3 * h * d),)


class CrossEntropy(Function):
    """Mean softmax cross-entropy over all positions (fused, numerically stable)."""

    name = "cross_entropy"
    need_grad: bool
    inplace: bool

    def forward(self, logits: Any, targets: Any) -> Any:
        self.shape = logits.shape
        flat = logits.reshape(-1, logits.shape[-1])
        loss, self.state = self.kernels.cross_entropy(
            flat, targets.reshape(-1), self.need_grad, self.inplace
        )
        return loss

    def backward(self, grad: Any) -> Sequence[Any]:
        return self.kernels.cross_entropy_backward(self.state, grad).reshape(self.shape), None


class LMHeadCrossEntropy(Function):
    """Mean cross-entropy of the tied LM head's logits h @ W.T, (N, E) x (V, E), as one op.

    The (N, V) logits dominate the step's memory traffic, so the backend gets GEMMs and
    softmax together and chooses how to avoid passes over them (the CPU never forms
    d(logits)). Its GEMMs are timed as matmul entries of their own, as in attention.
    """

    name = "lm_head_xent"
    need_grad: bool

    def forward(self, h: Any, w: Any, targets: Any) -> Any:
        loss, self.state = self.kernels.lm_head_xent(
            h, w, targets.reshape(-1), self.need_grad,
            functools.partial(self.matmul, phase="forward"),
        )
        return loss

    def backward(self, grad: Any) -> Sequence[Any]:
        dh, dw = self.kernels.lm_head_xent_backward(
            self.state, grad, self.needs_input_grad[0], self.needs_input_grad[1],
            functools.partial(self.matmul, phase="backward"),
        )
        return dh, dw, None


class CachedAttention(Function):
    """Causal attention of T new positions over a KV cache: (B, T, 3E) -> (B, T, E).

    The new keys and values are written into `keys`/`values` (B, H, S_max, D) at positions
    start..start+T, and each query attends over every cached position up to its own. From an
    empty cache (a prefill) that is the training kernel's causal softmax; after cached
    positions the mask is offset by `start` (none is needed for a single query).

    Inference only: the cache is state written in place, which autograd cannot replay, so
    backward raises; run it under no_grad().
    """

    name = "cached_attention"
    keys: Any
    values: Any
    start: int
    n_head: int

    def forward(self, qkv: Any) -> Any:
        xp = self.xp
        b, t, e3 = qkv.shape
        start, end = self.start, self.start + t
        split = qkv.reshape(b, t, 3, self.n_head, e3 // 3 // self.n_head)
        q, k, v = split.transpose(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        scale = 1.0 / math.sqrt(q.shape[-1])
        att = self.matmul(q, xp.swapaxes(self.keys[:, :, :end], -1, -2), "forward")  # (B,H,T,S)
        if start == 0:
            probs = self.kernels.causal_softmax_forward(att, scale)
        else:
            att *= scale
            if t > 1:  # query i sits at position start + i
                xp.copyto(att, -xp.inf, where=xp.arange(end) > xp.arange(start, end)[:, None])
            att -= att.max(axis=-1, keepdims=True)
            probs = xp.exp(att, out=att)
            probs /= probs.sum(axis=-1, keepdims=True)
        y = self.matmul(probs, self.values[:, :, :end], "forward")  # (B, H, T, D)
        return y.transpose(0, 2, 1, 3).reshape(b, t, e3 // 3)  # (B, T, E)

    def backward(self, grad: Any) -> Sequence[Any]:
        raise NotImplementedError("attention over a KV cache is inference-only: no backward "
                                  "(run the model under no_grad() when passing a cache)")


# ---- functional API ----------------------------------------------------------------------------
def add(a: Tensor, b: Tensor | float) -> Tensor:
    return Add.apply(a, b) if isinstance(b, Tensor) else ScalarAdd.apply(a, c=float(b))


def mul(a: Tensor, b: Tensor | float) -> Tensor:
    return Mul.apply(a, b) if isinstance(b, Tensor) else ScalarMul.apply(a, c=float(b))


def matmul(a: Tensor, b: Tensor, transpose_b: bool = False) -> Tensor:
    return MatMul.apply(a, b, transpose_b=transpose_b)


def linear(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return Linear.apply(x, w, b)


def mlp(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    return MLP.apply(x, w1, b1, w2, b2)


def reshape(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    return Reshape.apply(x, shape=tuple(shape))


def transpose(x: Tensor, axes: tuple[int, ...] | None = None) -> Tensor:
    return Transpose.apply(x, axes=tuple(axes) if axes else None)


def index(x: Tensor, key: Any) -> Tensor:
    return Index.apply(x, key=key)


def split(x: Tensor, sections: int, axis: int = -1) -> list[Tensor]:
    """Split into equal parts along `axis` (each part a view with its own gradient)."""
    n = x.shape[axis]
    if n % sections:
        raise ValueError(f"split: axis of size {n} is not divisible into {sections} parts")
    step, axis = n // sections, axis % x.ndim
    lead = (slice(None),) * axis
    return [index(x, (*lead, slice(i * step, (i + 1) * step))) for i in range(sections)]


def sum(x: Tensor, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Tensor:
    return Sum.apply(x, axis=axis, keepdims=keepdims)


def mean(x: Tensor, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Tensor:
    total = Sum.apply(x, axis=axis, keepdims=keepdims)
    return mul(total, total.data.size / x.data.size)


def gelu(x: Tensor, bias: Tensor | None = None) -> Tensor:
    return Gelu.apply(x) if bias is None else Gelu.apply(x, bias)


def randomness(x: Tensor, seed: int = 0) -> Randomness:
    """Randomness at step 0 on x's device (for calls outside a training step)."""
    return Randomness(seed, x.backend.xp.zeros((), dtype="int32"))


def dropout(x: Tensor, p: float, rng: Randomness | None = None, site: int = 0) -> Tensor:
    """Inverted dropout of x with the mask of (rng, site); p = 0 returns x itself."""
    if p == 0.0:
        return x
    return Dropout.apply(x, p=p, rng=rng or randomness(x), site=site)


def word_dropout(emb: Tensor, idx: Tensor, vocab_size: int, p: float, rng: Randomness,
                 site: int) -> Tensor:
    """Whole-word dropout of looked-up embeddings emb (B, T, E) of tokens idx (B, T): one
    mask over the vocabulary, so every occurrence of a word in the step is dropped (or kept
    and scaled by 1/(1-p)) together."""
    if p == 0.0:
        return emb
    rows = rng.mask(emb.backend.kernels, (vocab_size,), emb.dtype, p, site,
                    per_shard=False)  # (V,)
    return mul(emb, Tensor.wrap(rows[idx.data][..., None], emb.backend))  # (B, T, 1)


def embedding(weight: Tensor, idx: Tensor) -> Tensor:
    return Embedding.apply(weight, idx)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    return LayerNorm.apply(x, weight, bias, eps=eps)


def causal_self_attention(qkv: Tensor, n_head: int, dropout: float = 0.0,
                          rng: Randomness | None = None, site: int = 0) -> Tensor:
    """Attention with its probabilities dropped by the mask of (rng, site) when dropout > 0."""
    if dropout > 0.0 and rng is None:
        rng = randomness(qkv)
    return CausalSelfAttention.apply(qkv, n_head=n_head, dropout=dropout, rng=rng, site=site)


def cross_entropy(logits: Tensor, targets: Tensor, inplace: bool = False) -> Tensor:
    """Mean NLL; inplace=True lets the op overwrite `logits` (do not read them afterwards)."""
    need = grad_enabled() and logits.requires_grad
    return CrossEntropy.apply(logits, targets, need_grad=need, inplace=inplace)


def lm_head_cross_entropy(h: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """Mean NLL of logits = h @ weight.T (N, V) against targets (N,), without returning them."""
    need = grad_enabled() and (h.requires_grad or weight.requires_grad)
    return LMHeadCrossEntropy.apply(h, weight, targets, need_grad=need)


def cached_attention(qkv: Tensor, keys: Any, values: Any, start: int, n_head: int) -> Tensor:
    """Causal attention of qkv's T positions, appended at `start` to the (B, H, S_max, D)
    key/value arrays, over all start+T cached positions (inference only)."""
    return CachedAttention.apply(qkv, keys=keys, values=values, start=start, n_head=n_head)


# ---- operator sugar -------------------------------------------------------------------------
def _sub(a: Tensor, b: Tensor | float) -> Tensor:
    return add(a, mul(b, -1.0) if isinstance(b, Tensor) else -b)


def _reshape(x: Tensor, *shape: Any) -> Tensor:
    return reshape(x, shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape)


def _transpose(x: Tensor, *axes: int) -> Tensor:
    return transpose(x, axes or None)


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
