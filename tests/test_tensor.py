"""Tensor and autograd mechanics: devices, transfers, gradient accumulation, no_grad."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from conftest import DEVICES

from rustyflow_py.engine import ops
from rustyflow_py.engine.backend import (
    DeviceError,
    TransferError,
    counting_transfers,
    strict_transfers,
)
from rustyflow_py.engine.tensor import Tensor, no_grad

GPU = DEVICES[1]


def test_tensor_used_twice_accumulates_its_gradient(device: str) -> None:
    x = Tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True, device=device)
    (x * x + x).sum().backward()  # d/dx (x^2 + x) = 2x + 1
    np.testing.assert_allclose(x.backend.to_host(x.grad), [3.0, -3.0, 7.0])


def test_backward_frees_the_graph_and_cannot_run_twice(device: str) -> None:
    x = Tensor(np.ones((2, 3)), requires_grad=True, device=device)
    hidden = x * 3.0
    loss = ops.sum(hidden * hidden)
    loss.backward()
    assert loss._ctx is None and hidden._ctx.released  # saved activations released
    with pytest.raises(RuntimeError, match="not the result of a tracked op"):
        loss.backward()
    with pytest.raises(RuntimeError, match="'mul' a second time"):
        ops.sum(hidden * 2.0).backward()


def test_the_graph_keeps_only_what_backward_saved() -> None:
    """An intermediate no op saved (x * 3 and + 1 need no arrays for backward) is freed when
    the model drops it, though the graph still runs backward through its producer. (The
    graph code is device-agnostic; NumPy arrays can be watched with a weak reference.)"""
    x = Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    hidden = x * 3.0
    freed = weakref.ref(hidden.data)
    out = hidden + 1.0
    del hidden
    gc.collect()
    assert freed() is None
    ops.sum(out * out).backward()  # d/dx (3x + 1)^2 = 6 (3x + 1)
    np.testing.assert_allclose(x.backend.to_host(x.grad), 6 * (3 * np.arange(6.0) + 1)
                               .reshape(2, 3))


def test_no_grad_records_nothing(device: str) -> None:
    x = Tensor(np.ones(4), requires_grad=True, device=device)
    with no_grad():
        y = x * 2.0
    assert y._ctx is None and not y.requires_grad


@pytest.mark.parametrize("gpu", [GPU])
def test_mixing_devices_is_an_error_naming_both(gpu: str) -> None:
    a, b = Tensor(np.ones(3), device="cpu"), Tensor(np.ones(3), device=gpu)
    with pytest.raises(DeviceError, match=r"different devices \(cpu and gpu\).*\.to\(device\)"):
        ops.add(a, b)
    np.testing.assert_array_equal((a.to("gpu") + b).numpy(), [2.0, 2.0, 2.0])


@pytest.mark.parametrize("gpu", [GPU])
def test_transfers_are_counted_and_strict_mode_refuses_them(gpu: str) -> None:
    host = np.arange(6, dtype=np.float32)
    with counting_transfers() as seen:
        t = Tensor(host, device=gpu)
        assert (seen.h2d_count, seen.h2d_bytes) == (1, host.nbytes)
        np.testing.assert_array_equal(t.numpy(), host)
        assert (seen.d2h_count, seen.d2h_bytes) == (1, host.nbytes)
        with strict_transfers(), pytest.raises(TransferError, match="24 bytes"):
            t.numpy()
    assert seen.d2h_count == 1  # the refused copy did not happen


def test_an_op_refuses_an_attribute_it_does_not_declare() -> None:
    """A misspelt keyword (eps -> esp) is an error naming it and what the op takes, not a
    silently ignored attribute; a missing required one is refused the same way."""
    x, w, b = (Tensor(np.ones(s, np.float32)) for s in ((2, 4), 4, 4))
    unknown = r"LayerNorm\.apply: unknown attribute\(s\) esp; it takes: eps"
    with pytest.raises(TypeError, match=unknown):
        ops.LayerNorm.apply(x, w, b, esp=1e-5)
    with pytest.raises(TypeError, match=r"LayerNorm\.apply: missing attribute\(s\) eps"):
        ops.LayerNorm.apply(x, w, b)
    assert ops.MatMul.attributes == {"transpose_b"} and not ops.MatMul.required
    assert ops.Sum.required == {"axis", "keepdims"}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_layernorm_joins_the_residual_gradient_in_its_backward(device: str, dtype: type,
                                                                  monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    """A pre-LN block's pattern, h = x + f(layer_norm(x)) with x produced by an op: the
    residual path gives x its gradient first, and the LayerNorm's backward adds its dx to
    it in its own pass (no grad_sum join), to the same gradients as the separate add, and
    the parameters' gradients go into their buffers."""
    from rustyflow_py.engine import autograd
    from rustyflow_py.engine.ops.layernorm.function import LayerNorm

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(dtype) for s in ((4, 5, 40), (40,), (40,), (40,))]
    weights = rng.standard_normal((4, 5, 40)).astype(dtype)

    def grads(joined: bool) -> tuple[list[np.ndarray], list[str]]:
        ran: list[str] = []
        real = autograd.run_op

        def record(name: str, *args: object, **kwargs: object) -> object:
            ran.append(name)
            return real(name, *args, **kwargs)

        with monkeypatch.context() as m:
            m.setattr(autograd, "run_op", record)
            if not joined:
                m.setattr(LayerNorm, "joins", ())
            x0, w, b, scale = (Tensor(a, requires_grad=True, device=device) for a in arrays)
            for p in (w, b):  # parameters: gradient buffers of their own
                p.grad = p.backend.xp.zeros(p.shape, dtype=dtype)
            x = x0 * 2.0
            h = x + ops.layer_norm(x, w, b) * scale
            ops.sum(h * Tensor(weights, device=device)).backward()
        return [t.backend.to_host(t.grad) for t in (x0, w, b, scale)], ran

    (joined, ran), (separate, ran_separately) = grads(True), grads(False)
    assert "grad_sum" in ran_separately and "grad_sum" not in ran
    for got, want in zip(joined, separate, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_a_residual_must_match_the_layers_output() -> None:
    """linear/mlp add a residual as it is and hand it their output's gradient as it is, so a
    residual that would broadcast or be cast is refused, naming both."""
    rng = np.random.default_rng(1)
    x, w, b = (Tensor(rng.standard_normal(s).astype(np.float32)) for s in ((3, 4, 8), (8, 8),
                                                                           (8,)))
    ok = Tensor(rng.standard_normal((3, 4, 8)).astype(np.float32))
    np.testing.assert_allclose(ops.linear(x, w, b, residual=ok).numpy(),
                               ok.numpy() + x.numpy() @ w.numpy() + b.numpy(), atol=1e-5)
    for bad in (Tensor(np.zeros(8, np.float32)), Tensor(np.zeros((3, 4, 8), np.float64))):
        with pytest.raises(ValueError, match="must match the layer's output"):
            ops.linear(x, w, b, residual=bad)
        with pytest.raises(ValueError, match="must match the layer's output"):
            ops.mlp(x, w, b, w, b, residual=bad)
