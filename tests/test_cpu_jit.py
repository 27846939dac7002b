"""The optional numba CPU kernels (each op folder's jit.py) against the NumPy formulation they
replace.

Every test that needs numba skips without it; the NumPy side is the reference (its own
correctness is covered by the gradient checks and the PyTorch parity tests)."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest

from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.ops.cpu_set import CpuKernels, load_jit
from rustyflow_py.engine.policy import RunPolicy
from rustyflow_py.engine.tensor import Tensor
from rustyflow_py.errors import install_command
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.model.optim import AdamW, Schedule

T = TypeVar("T")
needs_numba = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None,
    reason="numba is not installed (pip install 'rustyflow-py[jit]')",
)


def cpu(jit: str) -> CpuKernels:
    """The CPU's kernels under a run policy of CPU_JIT=`jit`."""
    return get_backend("cpu", RunPolicy(cpu_jit=jit)).kernels


def both(fn: Callable[[CpuKernels], T]) -> tuple[T, T]:
    """fn(kernels) with the NumPy kernels, then with the numba kernels."""
    return fn(cpu("off")), fn(cpu("on"))


def exp_via_kernel(x: np.ndarray) -> np.ndarray:
    """The JIT exp over x (one row of an unshifted softmax)."""
    from rustyflow_py.engine.ops import cpu_jit as jit

    row = x.reshape(1, -1).astype(np.float32)
    out = np.empty_like(row)
    nll, sums = np.empty(1, np.float32), np.empty(1, np.float32)
    jit.softmax_xent.softmax_xent(out, row, np.zeros(1, np.int64), False, 0, nll, sums)
    return out[0]


@needs_numba
def test_jit_exp_is_within_one_ulp_over_the_finite_range() -> None:
    x = np.linspace(-87.0, 88.7, 1_000_003, dtype=np.float32)
    got = exp_via_kernel(x).astype(np.float64)
    exact = np.exp(x.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - exact) / ulp) <= 1.0


@needs_numba
def test_jit_exp_keeps_ieee_special_values() -> None:
    x = np.array([-np.inf, -200.0, -88.0, 0.0, 89.0, np.inf, np.nan], np.float32)
    got = exp_via_kernel(x)
    assert got[0] == 0.0 and got[1] == 0.0 and 0.0 <= got[2] < 1e-37 and got[3] == 1.0
    assert np.isposinf(got[4]) and np.isposinf(got[5]) and np.isnan(got[6])


@needs_numba
@pytest.mark.parametrize("inplace", [False, True])
def test_jit_cross_entropy_matches_numpy(inplace: bool) -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((37, 1001)) * 4).astype(np.float32)
    logits[3] += 500.0  # a row only the max shift keeps finite
    targets = rng.integers(0, 1001, 37)
    (l0, g0), (l1, g1) = both(
        lambda kernels: kernels.cross_entropy(logits.copy(), targets, True, inplace))
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    np.testing.assert_allclose(g1, g0, rtol=1e-4, atol=1e-9)


@needs_numba
def test_jit_lm_head_matches_numpy_including_rows_that_must_be_redone() -> None:
    """The fused LM head skips the max shift; rows whose exponentials overflow (row 1) or
    all underflow (row 2) are recomputed shifted, on both paths."""
    rng = np.random.default_rng(1)
    h = rng.standard_normal((24, 16)).astype(np.float32)
    w = rng.standard_normal((3000, 16)).astype(np.float32)
    h[1] *= 40.0
    h[2] = -h[1]
    w[:, :] += np.abs(w).mean()  # logits of row 2 all very negative
    targets = rng.integers(0, 3000, 24)
    def head(kernels: CpuKernels) -> tuple[float, np.ndarray, np.ndarray]:
        mm = kernels.matmul
        loss, state = kernels.lm_head_xent(h, w, targets, True, mm)
        dh, dw = kernels.lm_head_xent_backward(state, np.float32(1.0), True, True, mm)
        return float(loss), dh, dw

    (l0, dh0, dw0), (l1, dh1, dw1) = both(head)
    assert np.isfinite(l1)
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    np.testing.assert_allclose(dh1, dh0, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dw1, dw0, rtol=1e-4, atol=1e-6)


@needs_numba
@pytest.mark.parametrize("with_bias", [False, True])
def test_jit_gelu_matches_numpy(with_bias: bool) -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 50, 96)) * 5).astype(np.float32)
    x[0, 0, :4] = [-60.0, -20.0, 20.0, 60.0]  # exp(-2u) under- and overflow
    bias = rng.standard_normal(96).astype(np.float32) if with_bias else None
    g = rng.standard_normal(x.shape).astype(np.float32)
    (y0, d0), (y1, d1) = both(
        lambda kernels: (kernels.gelu_forward(x, bias), kernels.gelu_backward(g, x, bias)))
    np.testing.assert_allclose(y1, y0, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(d1, d0, rtol=2e-5, atol=2e-6)


@needs_numba
@pytest.mark.parametrize("clip", [None, 0.25])
def test_jit_adamw_matches_numpy(clip: float | None) -> None:
    rng = np.random.default_rng(3)
    n, decay_size = 300_001, 200_003  # the decay boundary falls inside a block
    start = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    scale = None if clip is None else np.asarray(clip, np.float32)

    def steps(kernels: CpuKernels) -> list[np.ndarray]:
        p, g, m = (a.copy() for a in start)
        v = np.abs(start[1]) * 0.1
        for t in (1, 2, 3):
            kernels.adamw(p, g, m, v, np.asarray(1e-2, np.float32), np.asarray(t), scale,
                          (0.9, 0.95), 1e-8, 0.1, decay_size)
        return [p, m, v]

    for got, ref in zip(*both(steps), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)  # |p| ~ 1: a few ulp


@needs_numba
def test_jit_layernorm_matches_numpy() -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 300, 96)) * 3 + 1).astype(np.float32)
    w, b = (rng.standard_normal(96).astype(np.float32) for _ in range(2))
    g = rng.standard_normal(x.shape).astype(np.float32)

    def run(kernels: CpuKernels) -> tuple[np.ndarray, ...]:
        y, mean, rstd = kernels.layernorm_forward(x, w, b, 1e-5)
        return (y, mean, rstd, *kernels.layernorm_backward(g, x, w, mean, rstd))

    for got, ref in zip(*both(run), strict=True):
        np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-5)


@needs_numba
def test_jit_causal_attention_softmax_matches_numpy() -> None:
    """Forward (with the log-sum-exp), recompute from it, and backward; the masked keys
    above the diagonal must come out exactly zero."""
    rng = np.random.default_rng(6)
    scores = (rng.standard_normal((2, 3, 70, 70)) * 4).astype(np.float32)
    g = rng.standard_normal(scores.shape).astype(np.float32)

    def run(kernels: CpuKernels) -> tuple[np.ndarray, ...]:
        probs, lse = kernels.causal_softmax_forward(scores.copy(), 0.3, True)
        again = kernels.causal_softmax_recompute(scores.copy(), lse, 0.3)
        return probs, lse, again, kernels.causal_softmax_backward(g, probs, 0.3)

    ref, got = both(run)
    above = ~np.tri(70, dtype=bool)
    for a in (got[0], got[2], got[3]):
        assert not a[..., above].any()
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@needs_numba
def test_jit_scatter_add_rows_adds_repeated_indices() -> None:
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 9, (6, 5))  # 30 rows into 9: many repeats
    rows = rng.standard_normal((6, 5, 4)).astype(np.float32)
    start = rng.standard_normal((9, 4)).astype(np.float32)

    def run(kernels: CpuKernels) -> np.ndarray:
        table = start.copy()
        kernels.scatter_add_rows(table, idx, rows)
        return table

    ref, got = both(run)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ref.sum(0), start.sum(0) + rows.reshape(-1, 4).sum(0), rtol=1e-5)


@needs_numba
def test_float64_work_keeps_the_numpy_kernels() -> None:
    kernels = cpu("on")
    assert kernels._jit_for(np.zeros(2, np.float32)) is kernels.jit is not None
    assert kernels._jit_for(np.zeros(2, np.float32), np.zeros(2)) is None


@needs_numba
def test_training_with_and_without_jit_follows_the_same_losses() -> None:
    rng = np.random.default_rng(4)
    x = rng.integers(0, 500, (4, 16))
    y = rng.integers(0, 500, (4, 16))

    def run(kernels: CpuKernels) -> list[float]:
        model = GPT(GPTConfig(500, 16, 2, 2, 32), kernels.backend, seed=7)
        opt = AdamW(model.buffer, Schedule(3e-3, 2, 20, 0.1), grad_clip=1.0)
        losses = []
        for _ in range(15):
            model.buffer.zero_grad()
            loss = model(Tensor(x, device=kernels.backend), Tensor(y, device=kernels.backend))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ref, got = both(run)
    assert ref[-1] < ref[0] - 0.5  # it trained
    np.testing.assert_allclose(got, ref, rtol=1e-4)


def _dispatchers() -> list[object]:
    import numba

    from rustyflow_py.engine.ops import cpu_jit as jit
    from rustyflow_py.engine.ops import jit_compile

    return [f for module in (*jit.MODULES, jit_compile) for f in vars(module).values()
            if isinstance(f, numba.core.dispatcher.Dispatcher)]


@needs_numba
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_warm_up_compiles_everything_a_training_step_needs(dtype: type) -> None:
    """The trainer warms the kernels up before its first step, so compilation never lands
    in a step or in the profile: a step afterwards must not compile anything new."""

    from rustyflow_py.engine.ops import cpu_jit as jit

    backend = cpu("on").backend
    jit.warm_up()
    dispatchers = _dispatchers()
    before = [len(f.signatures) for f in dispatchers]
    for heads, seq_len in ((2, 8), (4, 64)):  # attention keeps the probabilities / the lse
        model = GPT(GPTConfig(300, seq_len, 1, heads, 16), backend, seed=1)
        opt = AdamW(model.buffer, Schedule(1e-3, 1, 10, 0.1))
        x = Tensor(np.arange(2 * seq_len, dtype=dtype).reshape(2, seq_len) % 300, device=backend)
        model(x, x).backward()
        opt.step()
    assert [len(f.signatures) for f in dispatchers] == before


@needs_numba
def test_warm_up_compiles_everything_generation_needs() -> None:
    """The warm-up (a training run's) compiles generation's kernels too, so a later generate
    or chat finds them in numba's cache: a prompt's prefill and the tokens drawn afterwards,
    greedy and nucleus, at batch 1 and more, must not compile anything new."""
    from rustyflow_py.data import Vocab
    from rustyflow_py.engine.ops import cpu_jit as jit
    from rustyflow_py.model.generate import Session
    from rustyflow_py.model.sampling import Sampling

    backend = cpu("on").backend
    jit.warm_up()
    before = [len(f.signatures) for f in _dispatchers()]
    model = GPT(GPTConfig(300, 16, 2, 2, 16), backend, seed=1)
    model.training = False
    words = Vocab([f"w{i}" for i in range(300)])
    for sampling in (Sampling(0.0), Sampling(1.0, top_p=0.9)):
        for batch in (1, 3):
            session = Session(model, words, sampling, 5, batch=batch)
            drawn = list(session.tokens([3, 4, 5], 6))
            assert len(drawn) == 6
    assert [len(f.signatures) for f in _dispatchers()] == before


def test_cpu_jit_on_without_numba_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba -> ImportError
    monkeypatch.delitem(sys.modules, "rustyflow_py.engine.ops.cpu_jit", raising=False)
    monkeypatch.delattr("rustyflow_py.engine.ops.cpu_jit", raising=False)
    assert load_jit("auto") is None
    assert load_jit("off") is None
    with pytest.raises(RuntimeError, match=r"CPU_JIT=on.*" + re.escape(install_command("jit"))):
        load_jit("on")
