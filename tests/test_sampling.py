"""Device sampling (model/sampling.py and the reference rules of engine/ops/sampling): the
rules against the host sampler they replaced."""

from __future__ import annotations

import numpy as np
import pytest

from rustyflow_py.engine.backend import get_backend
from rustyflow_py.engine.ops.sampling.reference import token_probs
from rustyflow_py.model.sampling import CHUNK, Sampler, Sampling


def host_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """rustyflow's earlier host rules, kept here as the reference: softmax(logits / T) cut to
    exactly top-k (argpartition), then the smallest most-likely set whose mass reaches p."""
    z = logits.astype(np.float64) / temperature
    if 0 < top_k < z.size:
        cut = np.full_like(z, -np.inf)
        keep = np.argpartition(-z, top_k - 1)[:top_k]
        cut[keep] = z[keep]
        z = cut
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if top_p < 1.0:
        order = np.argsort(-probs)
        kept = order[: int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1]
        nucleus = np.zeros_like(probs)
        nucleus[kept] = probs[kept]
        probs = nucleus / nucleus.sum()
    return probs


def host_sample(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
    """The earlier host draw: inverse CDF in vocabulary order, side="right"."""
    if s.temperature == 0:
        return int(np.argmax(logits))
    cdf = np.cumsum(host_probs(logits, s.temperature, s.top_k, s.top_p))
    return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), cdf.size - 1)


def probs_of(logits: np.ndarray, s: Sampling) -> np.ndarray:
    return token_probs(np, logits[None], s.temperature, s.top_k, s.top_p)[0]


SETTINGS = [Sampling(1.0), Sampling(0.7, top_k=5), Sampling(1.3, top_p=0.9),
            Sampling(0.8, top_k=20, top_p=0.75), Sampling(0.0), Sampling(2.0, top_k=1)]


@pytest.mark.parametrize("s", SETTINGS)
def test_device_rules_equal_the_host_rules_without_ties(s: Sampling) -> None:
    """Continuous random logits have no ties: the masks and probabilities are the host's."""
    logits = np.random.default_rng(5).standard_normal((3, 200)).astype(np.float32) * 3
    if s.temperature:
        for row in logits:
            np.testing.assert_allclose(probs_of(row, s), host_probs(row, s.temperature, s.top_k,
                                                                    s.top_p), rtol=1e-12)
    sampler = Sampler(get_backend("cpu"), s, seed=11, batch=1)
    rng = np.random.default_rng(11)  # the first sequence's stream is default_rng(seed)'s
    for step in range(CHUNK + 40):  # across a chunk of uniforms
        row = logits[step % 3]
        assert int(sampler(row[None])[0]) == host_sample(row, s, rng), step


def test_temperature_zero_is_argmax_without_dividing() -> None:
    logits = np.array([[0.1, 3.0, -1.0, 2.9], [5.0, 0.0, 0.0, 0.0]], np.float32)
    with np.errstate(all="raise"):
        ids = Sampler(get_backend("cpu"), Sampling(0.0), 0, batch=2)(logits)
    assert ids.tolist() == [1, 0]


def test_top_p_keeps_smallest_set_reaching_p_renormalised() -> None:
    probs = np.array([0.05, 0.5, 0.1, 0.2, 0.15])
    for p, kept in [(0.4, [1]), (0.6, [1, 3]), (0.8, [1, 3, 4]), (0.9, [1, 3, 4, 2]),
                    (0.99, [0, 1, 2, 3, 4])]:
        out = probs_of(np.log(probs), Sampling(1.0, top_p=p))
        assert sorted(np.flatnonzero(out)) == sorted(kept), p
        np.testing.assert_allclose(out[kept], probs[kept] / probs[kept].sum())
        assert out.sum() == pytest.approx(1.0)


def test_top_k_then_temperature_and_ties_kept_as_transformers() -> None:
    out = probs_of(np.array([1.0, 4.0, 2.0, 3.0]), Sampling(0.5, top_k=2))
    expected = np.exp(np.array([4.0, 3.0]) / 0.5)
    np.testing.assert_allclose(out[[1, 3]], expected / expected.sum())
    assert out[[0, 2]].tolist() == [0.0, 0.0]
    tied = probs_of(np.array([1.0, 3.0, 3.0, 0.0]), Sampling(1.0, top_k=1))
    assert tied.tolist() == [0.0, 0.5, 0.5, 0.0]  # both logits equal to the k-th are kept


def test_samples_follow_the_nucleus_with_a_stream_per_sequence() -> None:
    probs = np.array([0.05, 0.5, 0.1, 0.2, 0.15])
    logits = np.log(np.tile(probs, (2, 1)))  # (2, V): two sequences, one distribution
    sampler = Sampler(get_backend("cpu"), Sampling(1.0, top_p=0.8), seed=0, batch=2)
    draws = np.stack([sampler(logits) for _ in range(3000)])  # (N, 2)
    assert set(draws.ravel().tolist()) == {1, 3, 4}
    assert (draws[:, 0] != draws[:, 1]).any()  # the sequences draw their own uniforms
    for b in range(2):
        freq = np.bincount(draws[:, b], minlength=5)[[1, 3, 4]] / draws.shape[0]
        np.testing.assert_allclose(freq, np.array([0.5, 0.2, 0.15]) / 0.85, atol=0.03)
