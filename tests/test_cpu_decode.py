"""A CPU token's fast path: CpuDecodeStep (model/decode.py) and the compiled sampler
(sampling/jit.py's nucleus_edge, inverse_cdf) give what the kernel set's own calls give, to
the bit."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.ops.gemm.cpu import STREAMED_ROWS
from rustyflow_py.engine.policy import RunPolicy
from rustyflow_py.model.decode import CpuDecodeStep, DecodeStep, decode_step
from rustyflow_py.model.gpt import GPT, GPTConfig

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba is not installed (CPU_JIT)")
MODES = [(0.8, 0, 0.9), (1.0, 0, 0.5), (0.7, 50, 0.95), (1.3, 0, 1.0), (0.8, 3, 1.0),
         (2.0, 0, 0.999999)]  # temperature, top_k, top_p


def rows_of(rng: np.random.Generator, case: int, v: int) -> np.ndarray:
    """Logits (2, v): spread out, rounded to ties, a third at -inf, or all equal."""
    logits = (rng.standard_normal((2, v)) * [0.01, 3.0, 60.0][case % 3]).astype(np.float32)
    if case % 4 == 1:
        logits = np.round(logits)
    if case % 4 == 2:
        logits[:, : v // 3] = -np.inf
    if case % 4 == 3:
        logits[:] = 1.0
    return logits


@pytest.mark.parametrize("v", [5, 2048, 2049, 33278])  # at and past the sorted rows' limit
def test_the_compiled_sampler_draws_what_the_numpy_one_draws(v: int) -> None:
    compiled = get_backend("cpu", RunPolicy(cpu_jit="on")).kernels
    plain = get_backend("cpu", RunPolicy(cpu_jit="off")).kernels
    rng = np.random.default_rng(v)
    for case in range(12):
        logits = rows_of(rng, case, v)
        for temperature, top_k, top_p in MODES:
            u = rng.random(2)
            u[0] = [0.0, 1.0 - 1e-12, u[0]][case % 3]  # the draw's edges
            ours = compiled.sample_rows(logits, u, temperature, top_k, top_p)
            theirs = plain.sample_rows(logits, u, temperature, top_k, top_p)
            assert ours.tolist() == theirs.tolist(), (case, temperature, top_k, top_p)


def model_of(policy: RunPolicy, dtype: object = np.float32) -> GPT:
    cfg = GPTConfig(300, 32, 2, 4, 32)
    model = GPT(cfg, get_backend("cpu", policy), seed=3, dtype=dtype)
    model.p["wte"].data[...] *= 10  # far from uniform
    model.training = False
    return model


@pytest.mark.parametrize("batch", [1, 3])
def test_the_cpu_decode_step_gives_the_kernel_sets_logits_and_cache(batch: int) -> None:
    """Two caches filled alike, one decoded by CpuDecodeStep, one by the kernel-set
    DecodeStep: the same logits and the same keys and values, bit for bit, past the
    prompt."""
    model = model_of(RunPolicy(cpu_jit="on"))
    fast = CpuDecodeStep(model, model.new_cache(batch))
    plain = DecodeStep(model, model.new_cache(batch))
    rng = np.random.default_rng(batch)
    for pos in range(20):
        tokens = rng.integers(0, model.cfg.vocab_size, batch)
        for step in (fast, plain):
            step.tokens[...] = tokens
            step.pos.fill(pos)
            step(pos + 1)
        assert np.array_equal(fast.logits, plain.logits), pos
        assert np.array_equal(fast.cache.keys, plain.cache.keys)
        assert np.array_equal(fast.cache.values, plain.cache.values)


def test_the_cpu_decode_step_runs_where_its_kernels_are() -> None:
    """float32 with numba and a batch BLAS leaves whole; the kernel-set step otherwise."""
    model = model_of(RunPolicy(cpu_jit="on"))
    assert type(decode_step(model, model.new_cache(2))) is CpuDecodeStep
    assert type(decode_step(model, model.new_cache(STREAMED_ROWS))) is DecodeStep
    for other in (model_of(RunPolicy(cpu_jit="off")),
                  model_of(RunPolicy(cpu_jit="on"), np.float64)):
        assert type(decode_step(other, other.new_cache(1))) is DecodeStep

