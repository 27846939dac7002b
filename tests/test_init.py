"""Initial weights made on the parameters' own device (model/init.py): the Box-Muller draws
against a scalar re-derivation, their statistics, chunking, and CPU = GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.ops.dropout.philox import philox4x32
from rustyflow_py.model import init as init_mod
from rustyflow_py.model.gpt import GPT, GPTConfig, init_weights, weight_inits
from rustyflow_py.model.init import INIT_WORD, Init, standard_normal

CFG = GPTConfig(vocab_size=101, seq_len=16, n_layer=2, n_head=2, n_embd=32)


def scalar_normal(i: int, seed: int, stream: int) -> float:
    """Element i of (seed, stream), derived one element at a time with Python's math."""
    block, word = divmod(i, 4)
    ctr = tuple(np.array([c], np.uint32) for c in (block & 0xFFFFFFFF, block >> 32, 0, INIT_WORD))
    words = [int(w[0]) for w in philox4x32(np, ctr, (seed, stream))]
    a, b = words[word & 2], words[(word & 2) + 1]
    r = math.sqrt(-2.0 * math.log((a + 1.0) * 2.0 ** -32))
    theta = 2.0 * math.pi * 2.0 ** -32 * b
    return r * (math.cos(theta) if word % 2 == 0 else math.sin(theta))


def test_draws_follow_the_written_definition() -> None:
    z = standard_normal(np, 0, 23, seed=1337, stream=5)
    expected = [scalar_normal(i, 1337, 5) for i in range(23)]
    np.testing.assert_allclose(z, expected, rtol=1e-15, atol=1e-15)


def test_draws_are_standard_normal() -> None:
    n = 1 << 20
    z = standard_normal(np, 0, n, seed=7, stream=0)
    se = 1 / math.sqrt(n)
    assert abs(z.mean()) < 5 * se
    assert abs(z.std() - 1) < 5 * se
    assert abs(np.mean(np.abs(z) > 1.959964) - 0.05) < 5 * math.sqrt(0.05 * 0.95 / n)
    # the Box-Muller pair of one block is uncorrelated
    pairs = z.reshape(-1, 2)
    assert abs(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1]) < 5 * math.sqrt(2 / n)


def test_streams_and_seeds_are_distinct_and_repeatable() -> None:
    a = standard_normal(np, 0, 64, seed=3, stream=0)
    assert np.array_equal(a, standard_normal(np, 0, 64, seed=3, stream=0))
    assert not np.allclose(a, standard_normal(np, 0, 64, seed=3, stream=1))
    assert not np.allclose(a, standard_normal(np, 0, 64, seed=4, stream=0))


def test_chunked_filling_equals_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = Init((7, 13), std=0.5, seed=11, stream=2)
    whole = spec.on_host(np.float64)
    monkeypatch.setattr(init_mod, "CHUNK", 8)
    assert np.array_equal(spec.on_host(np.float64), whole)
    np.testing.assert_allclose(whole.ravel(), 0.5 * standard_normal(np, 0, 91, 11, 2))


def test_unaligned_start_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        standard_normal(np, 6, 10, seed=0, stream=0)


def test_gpt_init_keeps_the_gpt2_scheme() -> None:
    inits = weight_inits(CFG, seed=1)
    streams = [i.stream for i in inits.values() if i.std > 0]
    assert len(set(streams)) == len(streams)  # no two tensors share draws
    assert inits["wte"].std == 0.02
    assert inits["h.0.attn.c_proj.weight"].std == pytest.approx(0.02 / math.sqrt(2 * CFG.n_layer))
    assert inits["h.1.ln_1.weight"].fill == 1.0 and inits["h.1.ln_1.weight"].std == 0
    host = init_weights(CFG, seed=1)
    assert set(host) == set(inits) and all(host[n].shape == inits[n].shape for n in inits)


def test_cpu_model_is_built_without_host_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = get_backend("cpu")

    def refuse(*_: object) -> None:
        raise AssertionError("a host array was copied in: the weights must be made in place")

    monkeypatch.setattr(backend, "from_host", refuse)
    model = GPT(CFG, "cpu", seed=9)
    host = init_weights(CFG, seed=9)
    for name, t in model.p.items():
        assert np.array_equal(t.data, host[name]), name


@pytest.mark.gpu
@pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))
def test_gpu_builds_the_cpu_weights_on_the_device() -> None:
    backend = get_backend("gpu")
    before = backend.transfers.h2d_bytes
    model = GPT(GPTConfig(vocab_size=50304, seq_len=1024, n_layer=12, n_head=12, n_embd=768),
                "gpu", seed=1337)
    assert backend.transfers.h2d_bytes - before < 1024  # nothing of the model's size uploaded
    gpu = backend.to_host(model.buffer.flat)
    cpu = GPT(model.cfg, "cpu", seed=1337).buffer.flat
    differ = np.flatnonzero(gpu != cpu)
    ulps = np.abs(gpu.view(np.int32)[differ].astype(np.int64) - cpu.view(np.int32)[differ])
    print(f"{differ.size} of {cpu.size} elements differ, by at most {ulps.max(initial=0)} ulp")
    assert ulps.max(initial=0) <= 1
    assert differ.size <= cpu.size * 1e-6
