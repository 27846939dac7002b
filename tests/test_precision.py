"""The precision policy, and 16-bit kernels that compute and accumulate in float32.

Each float16 check runs a kernel on float16 inputs and the same kernel in float64 on the same
values (float64 being what test_gradcheck.py checks against finite differences), and holds
outputs and gradients to a relative error ||ours - ref|| / ||ref|| below TOL, on every device.
The inputs are chosen so that a kernel accumulating in float16 fails that tolerance;
test_inputs_catch_float16_accumulation shows it with float16-accumulating formulations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rustyflow_py.engine import ops
from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.precision import Precision, accumulate_dtype, is_16bit
from rustyflow_py.engine.tensor import Tensor
from rustyflow_py.training.config.config import KEYS

TOL = 1e-2  # float16 rounds each stored value by up to ~5e-4
BF16_TOL = 3e-2  # bfloat16 by up to ~4e-3
RNG = np.random.default_rng(0)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


def rel_err(ours: Any, ref: Any) -> float:
    a, b = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != reference {b.shape}"
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def fp16(a: Any) -> np.ndarray:
    """Values both runs can hold exactly: the float16 run's inputs, as float16."""
    return np.asarray(a, F16)


# ---- the policy ------------------------------------------------------------------------------
def test_policies() -> None:
    fp32, tf32, fp64 = (Precision.of(n) for n in ("fp32", "tf32", "fp64"))
    assert (fp32.storage, fp32.compute, fp32.accumulate, fp32.matmul_compute) == \
        (F32, F32, F32, "fp32")
    assert (tf32.storage, tf32.compute, tf32.accumulate, tf32.matmul_compute) == \
        (F32, F32, F32, "tf32")
    assert (fp64.storage, fp64.compute, fp64.accumulate, fp64.matmul_compute) == \
        (F64, F64, F64, "fp64")
    fp16 = Precision.of("fp16")
    assert (fp16.storage, fp16.compute, fp16.accumulate, fp16.matmul_compute) == \
        (F32, F16, F32, "fp32")
    assert fp16.mixed and fp16.loss_scaling and not fp32.mixed and not tf32.loss_scaling
    with pytest.raises(ValueError, match="'bf32'.*fp32, tf32, bf16, fp16, fp8, fp64"):
        Precision.of("bf32")


def test_bf16_policy() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = Precision.of("bf16")
    assert (bf16.storage, bf16.compute, bf16.accumulate, bf16.matmul_compute) == \
        (F32, np.dtype(ml_dtypes.bfloat16), F32, "fp32")
    assert bf16.mixed and not bf16.loss_scaling and is_16bit(bf16.compute)
    assert {Precision.of(n).name for n in KEYS["PRECISION"].choices} == \
        set(KEYS["PRECISION"].choices)


def test_accumulate_dtype() -> None:
    assert [accumulate_dtype(d) for d in (F16, F32, F64)] == [F32, F32, F64]
    assert [is_16bit(d) for d in (F16, F32, F64)] == [True, False, False]


# ---- float16 kernels against float64 ---------------------------------------------------------
def _run(device: str, fn: Callable[..., Tensor], arrays: list[np.ndarray], grad: np.ndarray,
         dtype: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    """fn's output and every input's gradient for upstream `grad`, all in `dtype`."""
    ts = [Tensor(a.astype(dtype), requires_grad=True, device=device) for a in arrays]
    out = fn(*ts)
    out.backward(out.backend.from_host(grad.astype(dtype)))
    return out.numpy(), [t.backend.to_host(t.grad) for t in ts]


def check_fp16(device: str, fn: Callable[..., Tensor], arrays: list[np.ndarray],
               grad: np.ndarray, half: np.dtype = F16) -> None:
    """fn in float16 (or `half`: bfloat16) against float64 on the same 16-bit values: the
    output and every gradient stay 16-bit and within TOL (BF16_TOL)."""
    arrays, grad = [a.astype(half) for a in arrays], grad.astype(half)
    tol = TOL if half == F16 else BF16_TOL
    out16, grads16 = _run(device, fn, arrays, grad, half)
    out64, grads64 = _run(device, fn, arrays, grad, F64)
    assert out16.dtype == half
    assert rel_err(out16, out64) < tol, f"output: {rel_err(out16, out64):.2e}"
    for i, (g16, g64) in enumerate(zip(grads16, grads64, strict=True)):
        assert g16.dtype == half, f"input {i}: gradient of {g16.dtype}"
        assert rel_err(g16, g64) < tol, f"input {i}: {rel_err(g16, g64):.2e}"


def bf16_dtype() -> np.dtype:
    return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)


GPU_ONLY = pytest.mark.skipif(gpu_unavailable_reason() is not None,
                              reason="bfloat16 kernels are the GPU's (mixed precision)")


@GPU_ONLY
@pytest.mark.gpu
def test_bf16_kernels_against_float64() -> None:
    """The same kernels (LayerNorm, bias + GELU, attention, LM head + cross-entropy) on
    bfloat16 data, as PRECISION=bf16 runs them, against float64 on the same values."""
    bf16 = bf16_dtype()
    for inputs in (layernorm_wide_rows, layernorm_many_rows):
        arrays, grad = inputs()
        check_fp16("gpu", ops.layer_norm, arrays, grad, bf16)
    arrays, grad = gelu_inputs()
    check_fp16("gpu", ops.gelu, arrays, grad, bf16)
    qkv = RNG.standard_normal((2, 32, 96)).astype(np.float32)
    check_fp16("gpu", lambda t: ops.causal_self_attention(t, 8), [qkv],
               RNG.standard_normal((2, 32, 32)).astype(np.float32), bf16)
    check_lm_head("gpu", bf16)


def layernorm_wide_rows() -> tuple[list[np.ndarray], np.ndarray]:
    """4096 features around 100: their sum (~4e5) overflows float16, and the variance's
    terms (~1) vanish in a float16 sum. Upstream g around 50: backward subtracts the row
    means of g w (~50), which float16 could not hold to the noise's precision."""
    rng = np.random.default_rng(1)
    x = fp16(100 + rng.standard_normal((4, 4096)) + rng.standard_normal((4, 1)))
    w, b = fp16(1 + 0.1 * rng.standard_normal(4096)), fp16(0.1 * rng.standard_normal(4096))
    return [x, w, b], fp16(50 + rng.standard_normal((4, 4096)))


def layernorm_many_rows() -> tuple[list[np.ndarray], np.ndarray]:
    """4096 rows with g around 0.75: the bias gradient's column sums reach ~3000, and float16
    stops adding them at 2048, where its spacing is 2."""
    rng = np.random.default_rng(2)
    x = fp16(3 + 2 * rng.standard_normal((4096, 16)))
    w, b = fp16(1 + 0.1 * rng.standard_normal(16)), fp16(0.1 * rng.standard_normal(16))
    return [x, w, b], fp16(0.75 + 0.1 * rng.standard_normal((4096, 16)))


def gelu_inputs() -> tuple[list[np.ndarray], np.ndarray]:
    """Over 4096 rows of x + bias around 1.5 and g around 0.75, the bias gradient's column
    sums reach ~2900, and float16 stops adding their terms (~0.8) at 2048."""
    rng = np.random.default_rng(3)
    x, bias = fp16(1.5 + rng.standard_normal((4096, 16))), fp16(0.1 * rng.standard_normal(16))
    return [x, bias], fp16(0.75 + 0.05 * rng.standard_normal((4096, 16)))


def softmax_inputs() -> tuple[np.ndarray, np.ndarray, float]:
    """Scaled scores around 400, where float16 keeps steps of 0.25: a float16 log-sum-exp
    would put the recomputed probabilities up to 13% off. Upstream g around 100: backward
    subtracts sum(g p) ~ 100, which float16 rounds by up to 0.03 against a noise of 1."""
    rng = np.random.default_rng(4)
    scores = fp16(3200 + 8 * rng.standard_normal((2, 3, 64, 64)))
    return scores, fp16(100 + rng.standard_normal((2, 3, 64, 64))), 0.125


@pytest.mark.parametrize("inputs", [layernorm_wide_rows, layernorm_many_rows])
def test_layernorm_fp16(device: str, inputs: Callable[[], Any]) -> None:
    arrays, grad = inputs()
    check_fp16(device, ops.layer_norm, arrays, grad)


def test_gelu_fp16(device: str) -> None:
    arrays, grad = gelu_inputs()
    check_fp16(device, ops.gelu, arrays, grad)
    check_fp16(device, ops.gelu, arrays[:1], grad)


def test_causal_softmax_fp16(device: str) -> None:
    """Forward (with the log-sum-exp, kept float32), recompute and backward, each kernel fed
    the same values in float16 and in float64."""
    backend = get_backend(device)
    kernels, dev, host = backend.kernels, backend.from_host, backend.to_host
    scores, g, scale = softmax_inputs()
    results = {}
    for dtype in (F16, F64):
        probs, lse = kernels.causal_softmax_forward(dev(scores.astype(dtype)), scale, True)
        again = kernels.causal_softmax_recompute(dev(scores.astype(dtype)), lse, scale)
        probs16 = host(probs).astype(F16).astype(dtype)  # backward's inputs: the same values
        ds = kernels.causal_softmax_backward(dev(g.astype(dtype)), dev(probs16), scale)
        results[dtype] = [host(a) for a in (probs, lse, again, ds)]
    assert [a.dtype for a in results[F16]] == [F16, F32, F16, F16]
    for name, ours, ref in zip(("probs", "lse", "recomputed", "d(scores)"), results[F16],
                               results[F64], strict=True):
        assert rel_err(ours, ref) < TOL, f"{name}: {rel_err(ours, ref):.2e}"


def test_attention_fp16(device: str) -> None:
    """The whole op, float16 GEMMs included; 8 heads of 4 at T=32 take the recompute path."""
    qkv = fp16(RNG.standard_normal((2, 32, 96)))
    check_fp16(device, lambda t: ops.causal_self_attention(t, 8), [qkv],
               fp16(RNG.standard_normal((2, 32, 32))))


def test_cross_entropy_fp16(device: str) -> None:
    """The loss is float32 (an accumulated statistic); d(logits) is float16."""
    backend = get_backend(device)
    kernels, dev, host = backend.kernels, backend.from_host, backend.to_host
    logits, targets = fp16(2 * RNG.standard_normal((8, 256))), RNG.integers(0, 256, 8)
    results = {}
    for dtype in (F16, F64):
        loss, state = kernels.cross_entropy(dev(logits.astype(dtype)), dev(targets), True,
                                            False)
        seed = backend.xp.asarray(0.7, loss.dtype)
        results[dtype] = [host(loss), host(kernels.cross_entropy_backward(state, seed))]
    assert [a.dtype for a in results[F16]] == [F32, F16]
    for ours, ref in zip(results[F16], results[F64], strict=True):
        assert rel_err(ours, ref) < TOL


def check_lm_head(device: str, half: np.dtype) -> None:
    """The loss is float32 (an accumulated statistic); both gradients are `half`."""
    h, w = (np.asarray(a, half) for a in (RNG.standard_normal((16, 32)),
                                          0.3 * RNG.standard_normal((128, 32))))
    targets = RNG.integers(0, 128, 16)
    results = {}
    for dtype in (half, F64):
        th, tw = (Tensor(a.astype(dtype), requires_grad=True, device=device) for a in (h, w))
        loss = ops.lm_head_cross_entropy(th, tw, Tensor(targets, device=device))
        loss.backward()
        results[dtype] = [loss.numpy(), th.backend.to_host(th.grad),
                          tw.backend.to_host(tw.grad)]
    assert [a.dtype for a in results[half]] == [F32, half, half]
    for ours, ref in zip(results[half], results[F64], strict=True):
        assert rel_err(ours, ref) < (TOL if half == F16 else BF16_TOL)


def test_lm_head_fp16(device: str) -> None:
    check_lm_head(device, F16)


# ---- the inputs above fail a kernel that accumulates in float16 ---------------------------------
def _sum16(x: np.ndarray, axis: int) -> np.ndarray:
    """Sum along `axis` rounding each partial sum to float16 (cumsum, unlike sum, does not
    accumulate in float32 internally)."""
    return np.take(np.cumsum(x, axis=axis, dtype=F16), [-1], axis=axis)


def _layernorm16(x: np.ndarray, w: np.ndarray, b: np.ndarray,
                 g: np.ndarray) -> list[np.ndarray]:
    """LayerNorm's y, dx, dw, db with every sum in float16."""
    c = np.float16(x.shape[-1])
    mean = _sum16(x, -1) / c
    xc = x - mean
    rstd = np.float16(1) / np.sqrt(_sum16(xc * xc, -1) / c + np.float16(1e-5))
    xhat = xc * rstd
    gw = g * w
    dx = rstd * (gw - _sum16(gw, -1) / c - xhat * (_sum16(gw * xhat, -1) / c))
    return [xhat * w + b, dx, _sum16(g * xhat, 0)[0], _sum16(g, 0)[0]]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # float16 overflows: part of the point
def test_inputs_catch_float16_accumulation() -> None:
    """The inputs above through formulations that round every partial sum to float16 (what
    a kernel with acc = half computes) miss TOL by far, where the kernels meet it."""
    k = get_backend("cpu").kernels
    for inputs in (layernorm_wide_rows, layernorm_many_rows):
        (x, w, b), g = inputs()
        y, mean, rstd = k.layernorm_forward(x.astype(F64), w.astype(F64), b.astype(F64), 1e-5)
        ref = [y, *k.layernorm_backward(g.astype(F64), x.astype(F64), w.astype(F64), mean,
                                        rstd)]
        errors = [rel_err(a, r) for a, r in zip(_layernorm16(x, w, b, g), ref, strict=True)]
        assert not max(errors) < 10 * TOL, f"{inputs.__name__}: {errors}"  # NaN counts

    (x, bias), g = gelu_inputs()
    dz = k.gelu_backward(g.astype(F64), x.astype(F64), bias.astype(F64))
    assert rel_err(_sum16(dz.astype(F16), 0)[0], dz.sum(0)) > 10 * TOL  # d(bias)

    scores, g, scale = softmax_inputs()
    probs, lse = k.causal_softmax_forward(scores.astype(F64), scale, True)
    again = k.causal_softmax_recompute(scores.astype(F64), lse.astype(F16).astype(F64), scale)
    assert rel_err(again, probs) > 2 * TOL  # the log-sum-exp kept in float16
    p16 = probs.astype(F16)
    ref = k.causal_softmax_backward(g.astype(F64), p16.astype(F64), scale)
    dot16 = _sum16(g * p16, -1)  # sum(g p) accumulated in float16
    assert rel_err(p16 * (g - dot16) * np.float16(scale), ref) > 2 * TOL


# ---- GPU only: 16-bit work inside a CUDA graph -------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))
def test_fp16_step_runs_in_a_cuda_graph() -> None:
    """cuBLAS float16 GEMMs and the float16 kernels capture and replay to the eager result."""
    from rustyflow_py.engine.graph import CapturedStep

    backend = get_backend("gpu")
    current = backend.xp.cuda.get_current_stream()
    assert current.ptr == backend.stream.ptr, (  # e.g. after to_host of a non-contiguous array
        "CuPy's current stream is not the backend's: kernels would run outside the capture")
    k, dev = backend.kernels, backend.from_host
    a, b = dev(fp16(RNG.standard_normal((4, 64, 32)))), dev(fp16(RNG.standard_normal((32, 48))))
    x, w, bias = (dev(fp16(RNG.standard_normal(s))) for s in ((64, 48), (48,), (48,)))

    def step() -> dict[str, Any]:
        h = k.matmul(a, b).reshape(-1, 48)
        y, _, _ = k.layernorm_forward(h, w, bias, 1e-5)
        att = k.causal_softmax_forward(k.matmul(a, a.swapaxes(-1, -2)), 0.2)
        return {"h": h, "y": y, "gelu": k.gelu_forward(x, bias), "att": att}

    eager = {name: backend.to_host(v) for name, v in step().items()}
    results: dict[str, Any] = {}
    captured = CapturedStep(backend, lambda: results.update(step()))
    captured.capture()
    for v in results.values():
        v.fill(0)
    captured.replay()
    backend.synchronize()
    for name, v in results.items():
        assert v.dtype == F16
        np.testing.assert_array_equal(backend.to_host(v), eager[name], err_msg=name)
