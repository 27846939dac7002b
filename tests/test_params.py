"""The parameter buffer's span table: layout, views, state dicts, buckets; build_model."""

from __future__ import annotations

import numpy as np
import pytest

from rustyflow_py.model.gpt import GPT, GPTConfig, build_model, init_weights
from rustyflow_py.model.params import ParameterBuffer, Span
from rustyflow_py.training.config.config import Config

CFG = GPTConfig(vocab_size=50, seq_len=8, n_layer=2, n_head=2, n_embd=16)


def buffer(device: str = "cpu", dtype: type = np.float32) -> ParameterBuffer:
    return ParameterBuffer(init_weights(CFG, seed=3), device, dtype)


def test_spans_tile_the_buffer_decayed_first(device: str) -> None:
    buf = buffer(device)
    weights = init_weights(CFG, seed=3)
    assert {s.name for s in buf.spans} == set(weights)
    assert [s.name for s in buf.spans] == list(buf.params)
    offset = 0
    for s in buf.spans:
        assert s.offset == offset and s.size == weights[s.name].size
        assert s.decayed == (len(s.shape) >= 2)
        offset += s.size
    assert offset == buf.flat.size
    decayed = [s.decayed for s in buf.spans]
    assert decayed == sorted(decayed, reverse=True)  # every decayed span before the rest
    assert buf.decay_size == sum(s.size for s in buf.spans if s.decayed)
    assert buf.shapes() == {n: w.shape for n, w in weights.items()}


def test_params_and_grads_are_views_at_their_spans(device: str) -> None:
    buf = buffer(device)
    host = buf.backend.to_host(buf.flat)
    for s in buf.spans:
        t = buf.params[s.name]
        assert t.shape == s.shape
        np.testing.assert_array_equal(buf.backend.to_host(t.data).ravel(),
                                      host[s.offset : s.offset + s.size])
        t.grad[...] = 1
    assert float(buf.backend.to_host(buf.grad).min()) == 1.0


def test_state_dict_round_trip() -> None:
    weights = init_weights(CFG, seed=3)
    state = buffer().state_dict()
    assert list(state) == [s.name for s in buffer().spans]
    for name, w in weights.items():
        np.testing.assert_array_equal(state[name], w)
    other = ParameterBuffer(init_weights(CFG, seed=4), "cpu", np.float64)
    other.load_state_dict(state)
    for name, w in weights.items():
        np.testing.assert_array_equal(other.params[name].data, w.astype(np.float64))
    with pytest.raises(ValueError, match="lacks parameters: wpe"):
        other.load_state_dict({n: w for n, w in state.items() if n != "wpe"})
    with pytest.raises(ValueError, match=r"shapes differ: wte \(49, 16\) \(model \(50, 16\)\)"):
        other.load_state_dict({**state, "wte": state["wte"][1:]})


def test_buckets_group_whole_consecutive_spans() -> None:
    shapes = {"b": (30,), "a": (10, 10), "c": (50,), "d": (300,), "e": (20,)}
    buf = ParameterBuffer({n: np.zeros(s, np.float32) for n, s in shapes.items()}, "cpu",
                          np.float32)
    assert buf.spans == (Span("a", 0, (10, 10), True), Span("b", 100, (30,), False),
                         Span("c", 130, (50,), False), Span("d", 180, (300,), False),
                         Span("e", 480, (20,), False))
    # float32: 600 bytes hold 150 elements; d (300 elements) gets a bucket of its own, and
    # the decayed a never shares one with the 1-D tensors after it
    assert buf.buckets(600) == [(0, 100), (100, 180), (180, 480), (480, 500)]
    assert buf.buckets(2000) == [(0, 100), (100, 500)]
    # 800 bytes hold 200 float32 elements, or 400 in a 2-byte reduce dtype
    assert buf.buckets(800) == [(0, 100), (100, 180), (180, 480), (480, 500)]
    assert buf.buckets(800, itemsize=2) == [(0, 100), (100, 500)]
    assert buf.buckets(4) == [(s.offset, s.offset + s.size) for s in buf.spans]


def test_buckets_of_a_model_cover_it_within_the_limit() -> None:
    buf = buffer()
    ends = {s.offset + s.size for s in buf.spans}
    biggest = max(s.size for s in buf.spans) * buf.flat.itemsize
    for max_bytes in (1, 1024, 8192, biggest, buf.flat.nbytes):
        buckets = buf.buckets(max_bytes)
        assert buckets[0][0] == 0 and buckets[-1][1] == buf.flat.size
        assert all(a[1] == b[0] for a, b in zip(buckets, buckets[1:], strict=False))
        for start, stop in buckets:
            assert stop in ends  # whole spans only
            assert not start < buf.decay_size < stop  # matrices and 1-D tensors apart
            inside = [s for s in buf.spans if start <= s.offset < stop]
            assert (stop - start) * buf.flat.itemsize <= max_bytes or len(inside) == 1


def test_build_model_from_a_run_config() -> None:
    cfg = Config(seq_len=8, num_layers=3, num_heads=2, embed_dim=16, dropout=0.1, seed=5)
    model = build_model(cfg, 40)
    assert model.cfg == GPTConfig(40, 8, 3, 2, 16, 0.1)
    assert model.buffer.shapes()["h.2.mlp.c_fc.weight"] == (16, 64)
    reference = GPT(GPTConfig(40, 8, 3, 2, 16, 0.1), "cpu", seed=5)
    np.testing.assert_array_equal(model.buffer.flat, reference.buffer.flat)
    assert build_model(cfg, 40, dtype=np.float64).buffer.flat.dtype == np.float64
