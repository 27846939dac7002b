"""The decode step (model/decode.py) against the model's forward; batches; CUDA graphs."""

from __future__ import annotations

import numpy as np
import pytest

from rustyflow_py.data import EOS, UNK, Vocab
from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.graph import GraphCaptureError
from rustyflow_py.engine.tensor import Tensor, no_grad
from rustyflow_py.model import graph_decode
from rustyflow_py.model.generate import Decoder, Sampling, Session
from rustyflow_py.model.gpt import GPT, GPTConfig

WORDS = [UNK, EOS, *(f"w{i}" for i in range(46))]
SEQ_LEN = 64


def model_of(device: str, dtype: object = np.float32, seq_len: int = SEQ_LEN,
             scale: float = 30.0) -> GPT:
    """A random GPT (3 layers, 4 heads of 8), its embeddings scaled up: far from uniform."""
    model = GPT(GPTConfig(len(WORDS), seq_len, 3, 4, 32), device, seed=2, dtype=dtype)
    model.p["wte"].data[...] *= scale
    model.training = False
    return model


def full_logits(model: GPT, rows: list[list[int]]) -> np.ndarray:
    """The last position's logits (B, V) of the plain forward on each row's last SEQ_LEN."""
    window = np.asarray([r[-model.cfg.seq_len:] for r in rows], np.int64)
    with no_grad():
        logits = model(Tensor(window, device=model.device))  # (B, T, V)
    return model.buffer.backend.to_host(logits.data)[:, -1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_decode_step_logits_equal_the_full_forward(device: str, dtype: object) -> None:
    """Two different sequences: a prefill, then single tokens by DecodeStep (no graphs),
    each step's logits those of the uncached forward on the whole prefix."""
    model = model_of(device, dtype)
    decoder = Decoder(model, batch=2, graphs=False)
    rng = np.random.default_rng(0)
    rows = rng.integers(0, len(WORDS), (2, 5)).tolist()
    decoder.feed_rows(rows)
    for _ in range(20):
        new = rng.integers(0, len(WORDS), (2, 1)).tolist()
        rows = [r + n for r, n in zip(rows, new, strict=True)]
        ours = model.buffer.backend.to_host(decoder.feed_rows(new))
        assert decoder.cache.length == len(rows[0])
        np.testing.assert_allclose(ours, full_logits(model, rows), rtol=1e-5,
                                   atol=1e-5 * np.abs(ours).max())


def greedy_reference(model: GPT, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens from the uncached forward over the window: what generation means."""
    context = list(prompt)
    for _ in range(n):
        context.append(int(np.argmax(full_logits(model, [context])[0])))
    return context[len(prompt):]


def greedy_session(model: GPT, prompt: list[int], n: int, batch: int = 1,
                   graphs: bool = False) -> np.ndarray:
    session = Session(model, Vocab(WORDS), Sampling(0.0), 0, batch=batch, graphs=graphs)
    return np.stack(list(session.tokens(prompt, n)), axis=1)  # (B, n)


def test_greedy_50_tokens_equal_the_uncached_model_past_seq_len(device: str) -> None:
    """50 greedy tokens by the decode step equal argmax of the full forward, here across a
    sliding window too (SEQ_LEN 32: the last tokens re-prefill)."""
    model = model_of(device, seq_len=32)
    prompt = [3, 4, 5, 6, 7]
    assert greedy_session(model, prompt, 50)[0].tolist() == greedy_reference(model, prompt, 50)


def test_batched_generation_repeats_one_prompt_per_sample(device: str) -> None:
    """Greedy: every sample is the single one. Sampled: sample 0 draws from
    default_rng(seed), as a single sample does, and the others from streams of their own."""
    model = model_of(device)
    single = greedy_session(model, [3, 4], 30)
    np.testing.assert_array_equal(greedy_session(model, [3, 4], 30, batch=3),
                                  np.repeat(single, 3, axis=0))
    hot, model = Sampling(1.5), model_of(device, scale=1.0)
    one = np.stack(list(Session(model, Vocab(WORDS), hot, 9).tokens([3, 4], 30)), axis=1)
    many = np.stack(list(Session(model, Vocab(WORDS), hot, 9, batch=4).tokens([3, 4], 30)),
                    axis=1)  # (4, 30)
    np.testing.assert_array_equal(many[0], one[0])
    assert len({tuple(row) for row in many.tolist()}) > 1


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
def test_graph_replayed_decode_equals_eager_decode(batch: int) -> None:
    """On the GPU: 50 greedy tokens from the captured decode step equal the eager step's,
    and its logits are the eager step's over the full window (the same kernels)."""
    from rustyflow_py.engine.backend import gpu_unavailable_reason

    if gpu_unavailable_reason() is not None:
        pytest.skip(str(gpu_unavailable_reason()))
    model = model_of("gpu")
    prompt = [3, 4, 5]
    eager = greedy_session(model, prompt, 50, batch)
    session = Session(model, Vocab(WORDS), Sampling(0.0), 0, batch=batch, graphs=True,
                      warn=pytest.fail)  # a failed capture fails the test
    replayed = np.stack(list(session.tokens(prompt, 50)), axis=1)
    assert session.draws.graph is not None  # generation's graph: each token drawn and decoded
    np.testing.assert_array_equal(replayed, eager)
    assert replayed[0].tolist() == greedy_reference(model, prompt, 50)


@pytest.mark.gpu
def test_the_backend_stream_stays_current_after_a_capture() -> None:
    """After the decode step's capture, CuPy's current stream is still the backend's: the
    sampler and the next token's inputs are ordered with the replays. (CuPy's `with stream:`
    used to leave the legacy default stream current, and a sampled token could then read
    logits a replay was still writing.)"""
    from rustyflow_py.engine.backend import gpu_unavailable_reason

    if gpu_unavailable_reason() is not None:
        pytest.skip(str(gpu_unavailable_reason()))
    import cupy

    model = model_of("gpu")
    backend = model.buffer.backend
    backend.make_current()
    decoder = Decoder(model, warn=pytest.fail)
    decoder.feed_rows([[3, 4]])
    decoder.feed_rows([[5]])  # the first single token: the capture
    assert decoder.run_step.graph is not None
    assert cupy.cuda.get_current_stream() == backend.stream


class BodyAsGraph:
    """CapturedStep's stand-in on the CPU: 'replay' runs the captured body (the step over the
    full window, keys after the position masked), so the replay path is checked here too."""

    def __init__(self, backend: object, body: object) -> None:
        self.body = body

    def capture(self) -> None:
        pass

    def replay(self) -> None:
        self.body()  # type: ignore[operator]


class FailingCapture(BodyAsGraph):
    def capture(self) -> None:
        raise GraphCaptureError("RuntimeError: no capture here")


@pytest.mark.parametrize("graph", [BodyAsGraph, FailingCapture])
def test_graph_decode_replay_and_fallback_on_the_cpu(monkeypatch: pytest.MonkeyPatch,
                                                     graph: type) -> None:
    """GraphDecode's full-window step (what the GPU captures) and its fallback after a failed
    capture both give the eager greedy tokens; the failure is a warning."""
    monkeypatch.setattr(graph_decode, "CapturedStep", graph)
    model, prompt = model_of("cpu"), [3, 4, 5]
    warnings: list[str] = []
    session = Session(model, Vocab(WORDS), Sampling(0.0), 0, batch=2, graphs=False)
    session.decoder.run_step = graph_decode.GraphDecode(session.decoder.step, warnings.append)
    replayed = np.stack(list(session.tokens(prompt, 50)), axis=1)
    np.testing.assert_array_equal(replayed, greedy_session(model, prompt, 50, batch=2))
    assert (session.decoder.run_step.graph is None) == (graph is FailingCapture)
    assert len(warnings) == (graph is FailingCapture)
    assert all("decoding eagerly" in w for w in warnings)


def check_decode_kernel(device: str, dtype_name: str, heads: int, s_len: int, d: int) -> None:
    """A device's decode_attention against the reference formulation on the same device, at
    the first, a middle and the last position: the outputs, and the caches the two wrote."""
    from rustyflow_py.engine.library import get_backend
    from rustyflow_py.engine.ops.attention.reference import AttentionReference
    from rustyflow_py.engine.precision import bfloat16

    backend = get_backend(device)
    kernels, xp = backend.kernels, backend.xp
    dtype = bfloat16() if dtype_name == "bfloat16" else np.dtype(dtype_name)
    rng = np.random.default_rng(3)
    b, e = 2, heads * d
    cache = rng.standard_normal((2, b, heads, s_len, d)).astype(np.float32)
    for pos in (0, s_len // 2, s_len - 1):
        qkv = xp.asarray(rng.standard_normal((b, 3 * e)).astype(np.float32)).astype(dtype)
        keys, values = (xp.asarray(c).astype(dtype) for c in cache)
        ref_keys, ref_values = keys.copy(), values.copy()
        at = xp.asarray([pos], dtype=np.int64)
        ours = kernels.decode_attention(qkv, keys, values, at, 0.125, s_len)
        ref = AttentionReference.decode_attention(kernels, qkv, ref_keys, ref_values, at,
                                                  0.125, pos + 1)
        assert xp.array_equal(keys, ref_keys) and xp.array_equal(values, ref_values)
        tol = {"float64": 1e-12, "float32": 1e-5}.get(dtype_name, 2e-2)
        np.testing.assert_allclose(backend.to_host(ours.astype(np.float32)),
                                   backend.to_host(ref.astype(np.float32)), rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))
@pytest.mark.parametrize(("dtype_name", "heads", "s_len", "d"),
                         [("float32", 4, 64, 8), ("bfloat16", 12, 1024, 64),
                          ("float16", 2, 300, 128), ("float64", 3, 40, 16)])
def test_the_decode_attention_kernel_equals_the_reference(dtype_name: str, heads: int,
                                                         s_len: int, d: int) -> None:
    """decode_attention.cu (split over chunks of positions, then combined)."""
    check_decode_kernel("gpu", dtype_name, heads, s_len, d)


@pytest.mark.parametrize(("dtype_name", "heads", "s_len", "d"),
                         [("float32", 4, 64, 8), ("float32", 6, 300, 64), ("float64", 3, 40, 16)])
def test_the_cpu_decode_attention_equals_the_reference(dtype_name: str, heads: int, s_len: int,
                                                       d: int) -> None:
    """The CPU's: attention/jit.py's decode_attention for float32 where numba is installed (the
    reference formulation without it, and for float64)."""
    check_decode_kernel("cpu", dtype_name, heads, s_len, d)
