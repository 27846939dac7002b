"""Finite-difference gradient checks in float64 for every op, on both devices."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from rustyflow_py.engine import ops
from rustyflow_py.engine.backend import Backend
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.policy import RunPolicy
from rustyflow_py.engine.tensor import Tensor

RNG = np.random.default_rng(0)


def gradcheck(
    device: str | Backend,
    fn: Callable[..., Tensor],
    arrays: list[np.ndarray],
    wrt: list[int] | None = None,
    eps: float = 1e-6,
    tol: float = 1e-6,
) -> None:
    """Compare backward() with central differences of sum(fn(*inputs) * R)."""
    wrt = list(range(len(arrays))) if wrt is None else wrt
    tensors = [Tensor(a, requires_grad=i in wrt, device=device) for i, a in enumerate(arrays)]
    out = fn(*tensors)
    r = np.asarray(RNG.standard_normal(out.shape))
    out.backward(out.backend.from_host(r))

    def objective() -> float:
        ts = [Tensor(a, device=device) for a in arrays]
        return float((fn(*ts).numpy() * r).sum())

    for i in wrt:
        analytic = tensors[i].backend.to_host(tensors[i].grad)
        base = arrays[i]
        numeric = np.zeros(base.shape)
        for j in range(base.size):
            pos = np.unravel_index(j, base.shape)
            old = base[pos]
            base[pos] = old + eps
            up = objective()
            base[pos] = old - eps
            down = objective()
            base[pos] = old
            numeric[pos] = (up - down) / (2 * eps)
        np.testing.assert_allclose(analytic, numeric, rtol=tol, atol=tol, err_msg=f"input {i}")


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def noncontig(*shape: int) -> np.ndarray:
    """A non-contiguous float64 view with the given shape (transposed storage)."""
    return np.ascontiguousarray(randn(*reversed(shape))).T


@pytest.mark.parametrize(
    ("sa", "sb"),
    [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 3)), ((2, 3), ())],
)
def test_add_mul_broadcast(device: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    a, b = randn(*sa), randn(*sb)
    gradcheck(device, ops.add, [a, b])
    gradcheck(device, ops.mul, [a.copy(), b.copy()])


def test_scalar_ops(device: str) -> None:
    gradcheck(device, lambda x: (x * 3.0 + 1.5) * -2.0, [randn(3, 5)])


@pytest.mark.parametrize(
    ("sa", "sb"), [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)),
                   ((2, 2, 3, 4), (2, 2, 4, 3))],
)
def test_matmul(device: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    gradcheck(device, ops.matmul, [randn(*sa), randn(*sb)])


def test_matmul_noncontiguous_and_transposed(device: str) -> None:
    gradcheck(device, ops.matmul, [noncontig(3, 4), noncontig(4, 5)])
    gradcheck(device, lambda a, b: ops.matmul(a, b, transpose_b=True),
              [randn(2, 3, 4), randn(5, 4)])


def test_shape_ops(device: str) -> None:
    gradcheck(device, lambda x: ops.reshape(x, (6, 4)), [randn(2, 3, 4)])
    gradcheck(device, lambda x: ops.transpose(x, (2, 0, 1)), [noncontig(2, 3, 4)])
    gradcheck(device, lambda x: ops.index(x, (slice(None), slice(1, 3))), [randn(3, 4)])
    gradcheck(device, lambda x: ops.split(x, 2, axis=1)[1] * 2.0, [randn(2, 4, 3)])


@pytest.mark.parametrize(
    ("axis", "keepdims"), [(None, False), (1, False), ((0, 2), True), (-1, True)]
)
def test_sum_mean(device: str, axis: int | tuple[int, ...] | None, keepdims: bool) -> None:
    gradcheck(device, lambda x: ops.sum(x, axis, keepdims), [randn(2, 3, 4)])
    gradcheck(device, lambda x: ops.mean(x, axis, keepdims), [noncontig(2, 3, 4)])


def test_gelu(device: str) -> None:
    gradcheck(device, ops.gelu, [randn(3, 7) * 2])
    gradcheck(device, ops.gelu, [randn(2, 3, 5), randn(5)])


def test_linear(device: str) -> None:
    gradcheck(device, ops.linear, [randn(2, 3, 5), randn(5, 4), randn(4)])
    gradcheck(device, ops.linear, [noncontig(6, 5), noncontig(5, 3), randn(3)])


def test_mlp(device: str) -> None:
    gradcheck(device, ops.mlp, [randn(2, 3, 4), randn(4, 8), randn(8), randn(8, 4), randn(4)])


def test_layer_norm(device: str) -> None:
    gradcheck(device, ops.layer_norm, [randn(2, 3, 8), randn(8), randn(8)])
    gradcheck(device, ops.layer_norm, [noncontig(4, 6), randn(6), randn(6)])


def test_embedding_repeated_indices(device: str) -> None:
    idx = np.array([[1, 3, 1], [0, 3, 3]])
    gradcheck(device, ops.embedding, [randn(5, 4), idx], wrt=[0])


def test_attention(device: str) -> None:
    # H*T <= 6E keeps the probabilities for backward; H*T > 6E recomputes them from the lse
    gradcheck(device, lambda qkv: ops.causal_self_attention(qkv, n_head=2), [randn(2, 5, 3 * 4)])
    gradcheck(device, lambda qkv: ops.causal_self_attention(qkv, n_head=4), [randn(2, 8, 3 * 4)])


def test_cross_entropy(device: str) -> None:
    targets = np.array([[0, 3, 2], [4, 4, 1]])
    gradcheck(device, lambda x, t: ops.cross_entropy(x, t), [randn(2, 3, 5) * 3, targets], wrt=[0])


@pytest.mark.parametrize("rows", [0, 4])  # LM_HEAD_CHUNK: all 6 rows at once; 4, then 2
def test_lm_head_cross_entropy(device: str, rows: int) -> None:
    targets = np.array([0, 6, 2, 2, 5, 1])
    gradcheck(get_backend(device, RunPolicy(head_chunk=rows)), ops.lm_head_cross_entropy,
              [randn(6, 4) * 2, randn(7, 4), targets], wrt=[0, 1])


def test_dropout_uses_one_mask(device: str) -> None:
    x = Tensor(randn(50, 40), requires_grad=True, device=device)
    y = ops.dropout(x, 0.3)
    y.backward(x.backend.xp.ones(y.shape))
    out, grad, xs = y.numpy(), x.backend.to_host(x.grad), x.numpy()
    kept = out != 0
    np.testing.assert_allclose(out[kept], xs[kept] / 0.7)
    np.testing.assert_allclose(grad, kept / 0.7)
    assert 0.2 < 1 - kept.mean() < 0.4
