"""Dropout from the counter-based generator: Philox4x32-10 against its published answers,
masks as a pure function of (seed, site, step, element) on every device, fresh per step,
independent per site, the right keep rate, and whole-word dropout."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rustyflow_py.engine import ops
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.ops.dropout import philox
from rustyflow_py.engine.tensor import Tensor
from rustyflow_py.model.gpt import GPT, GPTConfig

# Random123's known-answer tests for philox4x32_10: (counter, key) -> output
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def step_at(backend: Any, step: int) -> Any:
    return backend.from_host(np.array(step, dtype=np.int32))


def host_mask(shape: tuple[int, ...], p: float, seed: int, site: int, step: int,
              dtype: Any = np.float32) -> np.ndarray:
    return philox.dropout_mask(np, shape, dtype, p, seed, site, np.array(step, np.int32))


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_philox_matches_the_published_known_answers(counter: tuple[int, ...],
                                                    key: tuple[int, int],
                                                    expected: tuple[int, ...]) -> None:
    words = philox.philox4x32(np, tuple(np.array([c], np.uint32) for c in counter), key)
    assert tuple(int(w[0]) for w in words) == expected


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(7,), (3, 5, 13), (2, 4, 64, 64)])
def test_device_masks_equal_numpys_bit_for_bit(device: str, dtype: Any,
                                               shape: tuple[int, ...]) -> None:
    """The GPU's fused kernel and the CPU draw the same masks: runs agree across devices."""
    backend = get_backend(device)
    for step, site in ((0, 0), (1, 0), (12345, 7)):
        mine = backend.kernels.dropout_mask(shape, dtype, 0.3, 1337, site, step_at(backend, step))
        got = backend.to_host(mine)
        assert got.dtype == dtype and got.shape == shape
        np.testing.assert_array_equal(got, host_mask(shape, 0.3, 1337, site, step, dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_applying_a_mask_inline_equals_multiplying_by_it(device: str, dtype: Any) -> None:
    """dropout_apply draws the bits where it multiplies (no mask array on the GPU); its
    result is x times the mask, bit for bit, on a strided view too (the gradient's)."""
    backend = get_backend(device)
    x = np.random.default_rng(0).standard_normal((3, 8, 40)).astype(dtype)
    for view in (lambda a: a, lambda a: a.transpose(1, 0, 2)):
        xs = view(x)
        got = backend.to_host(backend.kernels.dropout_apply(
            view(backend.from_host(x)), 0.3, 1337, 5, step_at(backend, 9)))
        want = xs * host_mask(xs.shape, 0.3, 1337, 5, 9, dtype)
        np.testing.assert_array_equal(got, want)


def test_masks_are_fresh_per_step_site_and_seed() -> None:
    base = host_mask((4096,), 0.5, 1, 0, 0)
    for other in (host_mask((4096,), 0.5, 1, 0, 1), host_mask((4096,), 0.5, 1, 1, 0),
                  host_mask((4096,), 0.5, 2, 0, 0)):
        assert 0.4 < np.mean((base != 0) != (other != 0)) < 0.6  # independent: ~half differ
    np.testing.assert_array_equal(base, host_mask((4096,), 0.5, 1, 0, 0))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.9])
def test_keep_rate_and_scale(p: float) -> None:
    mask = host_mask((1 << 20,), p, 7, 3, 11)
    kept = mask != 0
    assert abs(kept.mean() - (1 - p)) < 3e-3
    np.testing.assert_array_equal(mask[kept], np.float32(1 / (1 - p)))
    assert abs(mask.mean() - 1.0) < 5e-3  # inverted dropout preserves the expectation


def test_a_prefix_of_a_larger_mask_is_the_same_mask() -> None:
    """Element i's draw depends on i alone, not on the size of the array it is in."""
    np.testing.assert_array_equal(host_mask((10,), 0.4, 5, 2, 3),
                                  host_mask((1000,), 0.4, 5, 2, 3)[:10])


def test_the_models_masks_follow_its_step_counter() -> None:
    cfg = GPTConfig(vocab_size=50, seq_len=8, n_layer=2, n_head=2, n_embd=16, dropout=0.3,
                    word_dropout=0.2)
    model = GPT(cfg, "cpu", seed=3)
    idx = Tensor(np.random.default_rng(0).integers(0, 50, (2, 8)).astype(np.int32))
    losses = {}
    for step in (0, 1, 0):
        model.rng.step[...] = step
        losses.setdefault(step, []).append(float(model(idx, idx).data))
    assert losses[0][0] == losses[0][1] != losses[1][0]
    model.training = False  # evaluation draws nothing
    first = float(model(idx, idx).data)
    model.rng.step[...] = 5
    assert float(model(idx, idx).data) == first


def test_word_dropout_drops_whole_rows_and_keeps_the_expectation() -> None:
    vocab, p = 40, 0.25
    emb = Tensor(np.ones((3, 50, 6), np.float32), requires_grad=True)
    idx = np.random.default_rng(1).integers(0, vocab, (3, 50)).astype(np.int32)
    means = []
    for step in range(400):
        rng = ops.Randomness(9, np.array(step, np.int32))
        out = ops.word_dropout(emb, Tensor(idx), vocab, p, rng, site=0).numpy()
        row_kept = out[..., 0] != 0
        for token in np.unique(idx):  # every occurrence of a word shares its fate
            assert len(set(row_kept[idx == token])) == 1
        assert set(np.unique(out)) <= {0.0, np.float32(1 / (1 - p))}
        assert (out == out[..., :1]).all()  # a row is dropped as a whole
        means.append(out.mean())
    assert abs(np.mean(means) - 1.0) < 0.02
    y = ops.word_dropout(emb, Tensor(idx), vocab, p, ops.Randomness(9, np.array(0, np.int32)), 0)
    y.backward(np.ones(y.shape, np.float32))
    np.testing.assert_array_equal(emb.grad, y.numpy())  # the gradient goes through the same mask
