"""The Linear and MLP ops with their bias and GELU fused into the GEMMs.

On the GPU these go through cuBLASLt's epilogues (BIAS, GELU_AUX_BIAS), and add weight
gradients into float32 buffers with beta = 1. Each test runs the same op with the epilogues
on and off (the shared formulation: GEMM, then a kernel) at every precision, checks that the
two agree to that precision's rounding, and that the epilogues really ran (cuBLASLt planned
each of them), so a silent fallback fails. The finite-difference checks (test_gradcheck.py)
and PyTorch parity (test_torch_parity.py) cover the ops' math on both devices.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rustyflow_py.engine import ops
from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.policy import RunPolicy
from rustyflow_py.engine.precision import Precision
from rustyflow_py.engine.tensor import Tensor

GPU = "gpu"
_GPU_REASON = gpu_unavailable_reason()
# precision -> max |fused - unfused| / max |unfused| per output and gradient
TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 1e-2, "bf16": 4e-2}
B, T, E = 2, 40, 64


@pytest.fixture
def gpu_kernels() -> Any:
    """The default GPU backend's kernels (epilogues on, fp32)."""
    if _GPU_REASON is not None:
        pytest.skip(_GPU_REASON)
    return get_backend(GPU).kernels


def gpu_backend(mode: str, epilogues: bool) -> Any:
    """The GPU under a run policy of PRECISION=`mode`, with cuBLASLt's epilogues or not."""
    return get_backend(GPU, RunPolicy(Precision.of(mode), epilogues=epilogues))


def run(op: Any, arrays: list[np.ndarray], dtype: Any, upstream: np.ndarray,
        backend: Any) -> list[np.ndarray]:
    """The op's output and every input's gradient on `backend`, as float64 host arrays."""
    ts = [Tensor(a.astype(dtype), requires_grad=True, device=backend) for a in arrays]
    y = op(*ts)
    y.backward(y.backend.from_host(upstream.astype(dtype)))
    return [np.asarray(y.numpy(), np.float64)] + [
        np.asarray(t.backend.to_host(t.grad), np.float64) for t in ts]


def rel_max(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def planned_epilogues(kernels: Any) -> set[int]:
    lt = kernels._cublaslt
    return set() if lt is None else {key[0] for key in lt._plans}


def linear_into_stream(x: Tensor, w: Tensor, b: Tensor, r: Tensor) -> Tensor:
    """A residual block's projection joining the stream r (the add as the GEMM's C)."""
    return ops.linear(x, w, b, residual=r)


def mlp_into_stream(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor,
                    r: Tensor) -> Tensor:
    return ops.mlp(x, w1, b1, w2, b2, residual=r)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(TOLERANCE))
def test_fused_linear_and_mlp_match_the_unfused_ops(gpu_kernels: Any, mode: str) -> None:
    precision = Precision.of(mode)
    fused_on, fused_off = gpu_backend(mode, True), gpu_backend(mode, False)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((B, T, E)).astype(np.float32)
    linear = [x, rng.standard_normal((E, 3 * E)).astype(np.float32) / 8,
              rng.standard_normal(3 * E).astype(np.float32)]
    mlp = [x, rng.standard_normal((E, 4 * E)).astype(np.float32) / 8,
           rng.standard_normal(4 * E).astype(np.float32),
           rng.standard_normal((4 * E, E)).astype(np.float32) / 16,
           rng.standard_normal(E).astype(np.float32)]
    residual = rng.standard_normal((B, T, E)).astype(np.float32)
    cases = [(ops.linear, linear, rng.standard_normal((B, T, 3 * E))),
             (ops.mlp, mlp, rng.standard_normal((B, T, E))),
             (linear_into_stream, [x, linear[1][:, :E], linear[2][:E], residual],
              rng.standard_normal((B, T, E))),
             (mlp_into_stream, [*mlp, residual], rng.standard_normal((B, T, E)))]
    for op, arrays, upstream in cases:
        want = run(op, arrays, precision.compute, upstream, fused_off)
        got = run(op, arrays, precision.compute, upstream, fused_on)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            err = rel_max(a, b)
            assert err < TOLERANCE[mode], f"{op.__name__} {mode}: output/grad {i}: {err:.2e}"
    planned = planned_epilogues(fused_on.kernels)
    lt = fused_on.kernels._cublaslt
    fused = {lt.epilogue_bias}
    if mode != "fp32":  # exact float32 keeps its own GELU kernel (see CudaKernels.linear)
        fused.add(lt.epilogue_gelu_aux_bias)
    if precision.compute != np.float32:  # float32 weight gradients from 16-bit inputs
        fused.add(lt.epilogue_default)
    assert fused <= planned, f"epilogues never planned: {fused - planned}"


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(TOLERANCE))
def test_a_second_backward_adds_into_the_gradient_buffers(gpu_kernels: Any, mode: str) -> None:
    """Leaves whose .grad exists in the accumulation dtype (a parameter's) get their weight
    and bias gradients added inside the GEMM (beta = 1) and the column sums: two backwards
    leave twice one backward's gradients, in float32 for 16-bit inputs."""
    precision = Precision.of(mode)
    backend = gpu_backend(mode, True)
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((B, T, E)), rng.standard_normal((E, 4 * E)) / 8,
              rng.standard_normal(4 * E), rng.standard_normal((4 * E, E)) / 16,
              rng.standard_normal(E)]
    upstream = rng.standard_normal((B, T, E)).astype(precision.compute)
    ts = [Tensor(a.astype(precision.compute), requires_grad=True, device=backend)
          for a in arrays]
    for t in ts[1:]:  # gradient buffers, as a model's parameters have
        t.grad = backend.xp.zeros(t.shape, dtype=np.float32)
    grads = []
    for _ in range(2):
        y = ops.mlp(*ts)
        y.backward(backend.from_host(upstream))
        grads.append([backend.to_host(t.grad).astype(np.float64) for t in ts[1:]])
    for once, twice in zip(*grads, strict=True):
        assert rel_max(twice, 2 * once) < 1e-5
    assert all(t.grad.dtype == np.float32 for t in ts[1:])


@pytest.mark.gpu
def test_float64_falls_back_to_the_shared_formulation(gpu_kernels: Any) -> None:
    """cuBLASLt has no float64 GEMMs: the ops still run (the gradient checks need them)."""
    rng = np.random.default_rng(4)
    x, w, b = rng.standard_normal((3, 8)), rng.standard_normal((8, 16)), rng.standard_normal(16)
    y = ops.linear(Tensor(x, device=GPU), Tensor(w, device=GPU), Tensor(b, device=GPU))
    np.testing.assert_allclose(y.numpy(), x @ w + b, rtol=1e-12)
