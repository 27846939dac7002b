"""Device sampling (model/sampling.py and the reference rules of engine/ops/sampling): the
rules against the host sampler they replaced; the decode loop's draw (next_tokens) and the
graph that replays it with the decode step (model/graph_decode.py)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

from rustyflow_py.data import EOS, Vocab
from rustyflow_py.engine.devices import gpu_unavailable_reason
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.ops.sampling.cuda import blocks_per_row
from rustyflow_py.engine.ops.sampling.reference import draw, token_probs
from rustyflow_py.model.generate import Session, chat_loop
from rustyflow_py.model.gpt import GPT, GPTConfig
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


# ---- the device sampler against the reference, every mode, both devices --------------------

MODES = {"greedy": Sampling(0.0), "temperature": Sampling(0.8),
         "top_k": Sampling(0.8, top_k=50), "top_p_alone": Sampling(0.8, top_p=0.9),
         "top_k_and_top_p": Sampling(0.8, top_k=50, top_p=0.95),
         "top_p_near_one": Sampling(1.0, top_p=0.999), "top_p_tiny": Sampling(1.3, top_p=0.01),
         "top_k_wide": Sampling(1.0, top_k=900, top_p=0.9)}
ALMOST_ONE = float(np.nextafter(1.0, 0.0))  # the largest uniform a Generator can draw


def tied_logits(rows: int, vocab: int, seed: int) -> np.ndarray:
    """Logits with ties at every cut: rounded to halves, four tokens tied for the top and a
    few -inf in every row; every third row from the second -inf on its first half, every
    third from the third all one value."""
    rng = np.random.default_rng(seed)
    host = np.round(rng.standard_normal((rows, vocab)) * 4) / 2
    host[:, 5:9] = host.max(axis=1, keepdims=True) + 1.0
    host[:, -3:] = -np.inf
    host[1::3, : vocab // 2] = -np.inf
    host[2::3] = 0.25
    return host.astype(np.float32)


def reference_ids(logits: np.ndarray, s: Sampling, u: np.ndarray) -> list[int]:
    """The reference rules (reference.py, on the host) at the uniforms u."""
    if s.temperature == 0:
        return np.argmax(logits, axis=-1).tolist()
    return draw(np, token_probs(np, logits, s.temperature, s.top_k, s.top_p), u).tolist()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("rows", "vocab"), [(3, 50257), (1, 33278), (140, 300)],
                         ids=["gpt2-vocab", "one-row", "more-rows-than-multiprocessors"])
def test_device_sampler_equals_the_reference(device: str, mode: str, rows: int,
                                             vocab: int) -> None:
    """Ties at every cut, and the uniforms' edges u = 0 and u -> 1 among random ones: the
    device's ids are the reference's (GPU: a row over many blocks at GPT-2's vocabulary, one
    block a row when the batch fills the GPU or top-k is on; top_k_wide and the rows of one
    value leave top-k more candidates than a block sorts, so it takes the passes)."""
    s = MODES[mode]
    backend = get_backend(device)
    logits = tied_logits(rows, vocab, seed=rows)
    dev_logits = backend.from_host(logits)
    rng = np.random.default_rng(7)
    for u in [np.zeros(rows), np.full(rows, ALMOST_ONE), *rng.random((6, rows))]:
        kernels = backend.kernels
        ids = (kernels.argmax_rows(dev_logits) if s.temperature == 0 else
               kernels.sample_rows(dev_logits, backend.from_host(u), s.temperature, s.top_k,
                                   s.top_p))
        assert backend.to_host(ids).tolist() == reference_ids(logits, s, u), u[:3]


@pytest.mark.parametrize("mode", MODES)
def test_the_seeded_sampler_draws_the_reference_tokens(device: str, mode: str) -> None:
    """Sampler (model/sampling.py) on either device: its uniforms are default_rng(seed)'s,
    across a chunk of them, and its tokens the reference's at each."""
    s = MODES[mode]
    backend = get_backend(device)
    logits = tied_logits(3, 1000, seed=4)
    sampler = Sampler(backend, s, seed=9, batch=1)
    rng = np.random.default_rng(9)
    for step in range(CHUNK + 20):
        row = logits[step % 3][None]
        u = np.array([rng.random()]) if s.temperature else np.zeros(1)
        got = backend.to_host(sampler(backend.from_host(row))).tolist()
        assert got == reference_ids(row, s, u), step


def test_a_draw_spreads_a_row_over_the_gpu_but_no_more_blocks_than_it_holds() -> None:
    """About 2 logits a thread (GPT-2's vocabulary over 25 blocks of 1024 threads), every
    block of a launch on the GPU at once (their rows wait for each other), one block a row
    once the batch alone fills the GPU."""
    assert blocks_per_row(50257, 1, 132) == 25
    assert blocks_per_row(33278, 1, 132) == 17
    assert blocks_per_row(50257, 8, 132) == 16  # 132 // 8
    assert blocks_per_row(50257, 64, 132) == 2
    assert blocks_per_row(300, 1, 132) == 1
    assert blocks_per_row(50257, 140, 132) == 1


def test_a_draw_with_top_k_takes_one_block_a_row() -> None:
    """Top-k's candidates are sorted within one block, so a row meets no other block; a k
    beyond the block's threads takes the spread passes."""
    assert blocks_per_row(50257, 1, 132, top_k=50) == 1
    assert blocks_per_row(50257, 1, 132, top_k=1024) == 1
    assert blocks_per_row(50257, 1, 132, top_k=1025) == 25


# ---- the decode loop's draw (next_tokens) and the graph that replays it --------------------

@pytest.mark.parametrize("mode", ["greedy", "temperature", "top_k", "top_p_alone",
                                  "top_k_and_top_p", "top_k_wide"])
@pytest.mark.parametrize(("rows", "vocab"), [(3, 50257), (1, 33278), (140, 300)],
                         ids=["gpt2-vocab", "one-row", "more-rows-than-multiprocessors"])
def test_next_tokens_draws_at_its_counter_and_advances(device: str, mode: str, rows: int,
                                                       vocab: int) -> None:
    """Each call draws the reference's ids at the uniforms of row count % N (u = 0 and
    u -> 1 among them), writes them into tokens and that row of the ring, and moves count and
    pos on by one: on the GPU one launch, whose last block to finish does the filing."""
    s = MODES[mode]
    backend = get_backend(device)
    xp, kernels = backend.xp, backend.kernels
    logits = tied_logits(rows, vocab, seed=rows + 1)
    dev_logits = backend.from_host(logits)
    n = 4
    host_u = np.concatenate([np.zeros((1, rows)), np.full((1, rows), ALMOST_ONE),
                             np.random.default_rng(3).random((n - 2, rows))])  # (N, B)
    uniforms = backend.from_host(host_u)
    count, pos = xp.zeros(1, np.int64), xp.full(1, 7, np.int64)
    tokens, ring = xp.zeros(rows, np.int64), xp.full((n, rows), -1, np.int64)
    for call in range(n + 2):  # past the ring's end: row 0 again
        kernels.next_tokens(dev_logits, uniforms, count, tokens, ring, pos, s.temperature,
                            s.top_k, s.top_p)
        want = reference_ids(logits, s, host_u[call % n])
        assert backend.to_host(tokens).tolist() == want, call
        assert backend.to_host(ring)[call % n].tolist() == want, call
        assert backend.to_host(count).tolist() == [call + 1]
        assert backend.to_host(pos).tolist() == [8 + call]


def word_model(device: str, seq_len: int) -> tuple[Any, Vocab]:
    """A tiny random GPT over 60 words whose logits are spread enough for every mode."""
    words = [EOS, *(f"w{i}" for i in range(1, 60))]
    model = GPT(GPTConfig(len(words), seq_len, 2, 2, 16), device, 0)
    model.p["wte"].data[...] *= 8
    model.training = False
    return model, Vocab(words)


@pytest.mark.gpu
@pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))
@pytest.mark.parametrize("mode", ["greedy", "temperature", "top_k", "top_p_alone",
                                  "top_k_and_top_p"])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_graph_decode_loop_draws_the_queued_steps_tokens(mode: str, batch: int) -> None:
    """On the GPU, the graph that draws and decodes each token (GraphDraws) gives the tokens
    of the eager steps with the Sampler: across the window's slide (SEQ_LEN 24), a
    continuation without a prompt, and chat replies cut at <eos> in the middle of a batch it
    ran ahead (what ran past is given back: the uniforms, the cache's length, the logits)."""
    s = MODES[mode]
    model, vocab = word_model("gpu", 24)
    graphs, eager = (Session(model, vocab, s, 5, batch=batch, graphs=g, warn=pytest.fail)
                     for g in (True, False))
    assert graphs.draws is not None and eager.draws is None
    for ids, n, stop in [([3, 4], 40, False), ([], 9, False), ([5], 30, True), ([], 30, True),
                         ([6, 7, 8], 30, True)]:
        got = [x.tolist() for x in graphs.tokens(ids, n, stop)]
        assert got == [x.tolist() for x in eager.tokens(ids, n, stop)], (ids, n)
        assert graphs.decoder.contexts == eager.decoder.contexts
        assert graphs.decoder.cache.length == eager.decoder.cache.length
    assert graphs.draws.graph is not None
    out = [io.StringIO(), io.StringIO()]
    for session, o in zip((graphs, eager), out, strict=True):
        chat_loop(session, io.StringIO("w1 w2\nw3\nw4 w5 w6\n"), o, io.StringIO(), 20)
    assert out[0].getvalue() == out[1].getvalue()
