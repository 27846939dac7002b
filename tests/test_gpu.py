"""GPU-only checks: fused CUDA kernels against the shared formulation, transfer-free steps,
CUDA-graph replay against eager, and CPU/GPU agreement. Skipped cleanly without CUDA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rustyflow_py.engine.backend import (
    counting_transfers,
    gpu_unavailable_reason,
    strict_transfers,
)
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.ops.reference_set import XpKernels
from rustyflow_py.engine.tensor import Tensor
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.model.optim import AdamW, Schedule
from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.training.config.config import Config
from rustyflow_py.training.run.loop import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason())),
]
RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def gpu() -> tuple[object, object]:
    backend = get_backend("gpu")
    return backend, XpKernels(backend)


def _dev(backend: object, *shape: int, dtype: type = np.float32) -> object:
    return backend.from_host(RNG.standard_normal(shape).astype(dtype))  # type: ignore[attr-defined]


def _close(a: object, b: object, dtype: type) -> None:
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(np.asarray(a.get()), np.asarray(b.get()), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_kernels_match_reference(gpu: tuple[object, object], dtype: type) -> None:
    backend, ref = gpu
    kernels = backend.kernels
    x, w, b = _dev(backend, 6, 5, 48, dtype=dtype), _dev(backend, 48, dtype=dtype), \
        _dev(backend, 48, dtype=dtype)
    g = _dev(backend, 6, 5, 48, dtype=dtype)
    for mine, theirs in zip(kernels.layernorm_forward(x, w, b, 1e-5),
                            ref.layernorm_forward(x, w, b, 1e-5), strict=True):
        _close(mine, theirs, dtype)
    _, mean, rstd = ref.layernorm_forward(x, w, b, 1e-5)
    for mine, theirs in zip(kernels.layernorm_backward(g, x, w, mean, rstd),
                            ref.layernorm_backward(g, x, w, mean, rstd), strict=True):
        _close(mine, theirs, dtype)
    for bias in (None, b):
        _close(kernels.gelu_forward(x, bias), ref.gelu_forward(x, bias), dtype)
        _close(kernels.gelu_backward(g, x, bias), ref.gelu_backward(g, x, bias), dtype)
    scores = _dev(backend, 2, 3, 37, 37, dtype=dtype)
    probs = kernels.causal_softmax_forward(scores.copy(), 0.3)
    _close(probs, ref.causal_softmax_forward(scores.copy(), 0.3), dtype)
    _, lse = kernels.causal_softmax_forward(scores.copy(), 0.3, True)
    _close(lse, ref.causal_softmax_forward(scores.copy(), 0.3, True)[1], dtype)
    _close(kernels.causal_softmax_recompute(scores.copy(), lse, 0.3), probs, dtype)
    _close(ref.causal_softmax_recompute(scores.copy(), lse, 0.3), probs, dtype)
    gp = _dev(backend, 2, 3, 37, 37, dtype=dtype)
    _close(kernels.causal_softmax_backward(gp, probs, 0.3),
           ref.causal_softmax_backward(gp, probs, 0.3), dtype)
    logits = _dev(backend, 9, 1001, dtype=dtype) * 4
    targets = backend.from_host(RNG.integers(0, 1001, 9).astype(np.int32))
    seed = backend.xp.asarray(0.7, dtype=dtype)
    loss, state = kernels.cross_entropy(logits.copy(), targets, True, True)
    loss_ref, state_ref = ref.cross_entropy(logits.copy(), targets, True, False)
    _close(loss, loss_ref, dtype)
    _close(kernels.cross_entropy_backward(state, seed),
           ref.cross_entropy_backward(state_ref, seed), dtype)
    idx = backend.from_host(RNG.integers(0, 7, (4, 5)))
    ge = _dev(backend, 4, 5, 8, dtype=dtype)
    table = backend.xp.zeros((7, 8), dtype)
    kernels.scatter_add_rows(table, idx, ge)  # repeated indices must all add up
    expected = np.zeros((7, 8), dtype)
    np.add.at(expected, backend.to_host(idx).ravel(), backend.to_host(ge).reshape(-1, 8))
    _close(table, backend.xp.asarray(expected), dtype)
    flat = _dev(backend, 1000, dtype=dtype)
    _close(kernels.l2_norm(flat), ref.l2_norm(flat), dtype)


def test_optimizer_kernels_match_reference(gpu: tuple[object, object]) -> None:
    backend, ref = gpu
    xp = backend.xp
    lr, step, scale = xp.asarray(1e-2, np.float32), xp.asarray(3, np.int32), \
        xp.asarray(0.5, np.float32)
    grads = _dev(backend, 500)
    states = []
    for kernels in (backend.kernels, ref):
        p = xp.ones(500, np.float32)
        m, v = xp.full(500, 0.1, np.float32), xp.full(500, 0.2, np.float32)
        kernels.adamw(p, grads, m, v, lr, step, scale, (0.9, 0.95), 1e-8, 0.1, 300)
        vel = xp.full(500, 0.3, np.float32)
        q = xp.ones(500, np.float32)
        kernels.sgd(q, grads, vel, lr, scale, 0.9, True, 0.1, 300)
        states.append((p, m, v, q, vel))
    for mine, theirs in zip(*states, strict=True):
        _close(mine, theirs, np.float32)


@pytest.mark.parametrize("n", [4096, 1001])  # the vector kernel, and the one-element one
@pytest.mark.parametrize("copy", [None, "bfloat16"])
def test_adam_and_the_norm_read_a_bf16_gradient_as_its_widened_copy(
        gpu: tuple[object, object], n: int, copy: str | None) -> None:
    """A data-parallel run's summed bf16 gradient, read as it is: the same bits as from the
    float32 copy it would have been widened into."""
    backend, _ = gpu
    xp = backend.xp
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    g16 = _dev(backend, n).astype(bf16)
    lr, step, scale = xp.asarray(1e-2, np.float32), xp.asarray(3, np.int32), \
        xp.asarray(0.5, np.float32)
    start, runs = RNG.standard_normal(n).astype(np.float32), []
    for g in (g16, g16.astype(np.float32)):
        p = xp.asarray(start)
        m, v = xp.full(n, 0.1, np.float32), xp.full(n, 0.2, np.float32)
        to = None if copy is None else xp.zeros(n, bf16)
        for name in ("adamw", "adam"):
            getattr(backend.kernels, name)(p, g, m, v, lr, step, scale, (0.9, 0.95), 1e-8,
                                           0.1, n // 3, to)
        runs.append([a.get() for a in (p, m, v, *(() if to is None else (to,)))])
    for mine, widened in zip(*runs, strict=True):
        np.testing.assert_array_equal(mine, widened)
    norm16, norm32 = backend.kernels.l2_norm(g16), backend.kernels.l2_norm(g16.astype(np.float32))
    assert norm16.dtype == np.float32
    np.testing.assert_allclose(float(norm16), float(norm32), rtol=1e-6)


def test_gather_batch_matches_slicing(gpu: tuple[object, object]) -> None:
    backend, _ = gpu
    xp = backend.xp
    stream = xp.arange(4 * 50, dtype=np.int32).reshape(4, 50)
    x, y = xp.zeros((4, 7), np.int32), xp.zeros((4, 7), np.int32)
    backend.kernels.gather_batch(stream, xp.asarray(9, np.int32), 7, x, y)  # 9 % 7 batches = 2
    np.testing.assert_array_equal(x.get(), stream.get()[:, 14:21])
    np.testing.assert_array_equal(y.get(), stream.get()[:, 15:22])


@pytest.mark.parametrize("dropout", [{}, {"dropout": 0.2, "word_dropout": 0.1}])
def test_training_step_makes_no_transfers(dropout: dict[str, float]) -> None:
    cfg = GPTConfig(vocab_size=101, seq_len=16, n_layer=2, n_head=2, n_embd=32, **dropout)
    model = GPT(cfg, "gpu", seed=0)
    steps_transfer_nothing(model, AdamW(model.buffer, Schedule(1e-3, 2, 10, 0.1)))


def test_a_chunked_head_and_bf16_moments_make_no_transfers() -> None:
    """LM_HEAD_CHUNK's loop (24 rows of 64: three chunks) and ADAM_STATE_DTYPE=bf16's
    kernels in a step: no host copy, which a captured step would replay with whatever its
    staging buffer held by then."""
    from rustyflow_py.engine.policy import RunPolicy
    from rustyflow_py.engine.precision import bfloat16

    cfg = GPTConfig(vocab_size=101, seq_len=16, n_layer=2, n_head=2, n_embd=32)
    model = GPT(cfg, get_backend("gpu", RunPolicy(head_chunk=24)), seed=0)
    steps_transfer_nothing(model, AdamW(model.buffer, Schedule(1e-3, 2, 10, 0.1),
                                        state_dtype=bfloat16()))


def steps_transfer_nothing(model: GPT, opt: Any, after: Any = None) -> None:
    """Two training steps of `model` (then `after(step counter)`, when given) copy nothing
    between host and device, synchronise nothing, and end with a finite loss."""
    import cupyx

    xp = model.buffer.backend.xp
    x = xp.asarray(RNG.integers(0, 101, (4, 16)), dtype=np.int32)
    y = xp.asarray(RNG.integers(0, 101, (4, 16)), dtype=np.int32)
    with counting_transfers() as seen, strict_transfers(), cupyx.allow_synchronize(False):
        for _ in range(2):
            model.buffer.zero_grad()
            loss = model(Tensor(x, device=model.buffer.backend),
                         Tensor(y, device=model.buffer.backend))
            loss.backward()
            opt.step()
            if after is not None:
                after(opt.step_count)
    assert seen.snapshot() == {"h2d_count": 0, "h2d_bytes": 0, "d2h_count": 0,
                               "d2h_bytes": 0}
    assert np.isfinite(float(loss.data.get()))


def _config(tmp_path: Path, device: str, **extra: object) -> Config:
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        words = [f"w{i % 37}" for i in range(6000)]
        corpus.write_text("\n".join(" ".join(words[i:i + 12]) for i in range(0, 6000, 12)))
    values: dict[str, object] = dict(
        dataset=str(corpus), seq_len=16, batch_size=4, embed_dim=32, num_heads=2, num_layers=2,
        log_file=str(tmp_path / "log.txt"), model_path=str(tmp_path / "m.npz"), device=device,
        log_interval=5, warmup_steps=3, profile_steps=3, max_steps=20, learning_rate=3e-3)
    values.update(extra)
    return Config(**values)  # type: ignore[arg-type]


def _losses(cfg: Config) -> tuple[list[float], Trainer]:
    """Train `cfg`; the runs a test compares share its checkpoint path (`overwrite`)."""
    trainer = Trainer(cfg, say=lambda _: None, overwrite=True)
    trainer.run()
    return trainer.losses, trainer


def test_graph_replay_matches_eager(tmp_path: Path) -> None:
    eager, _ = _losses(_config(tmp_path, "gpu", graph="off"))
    graph, trainer = _losses(_config(tmp_path, "gpu", graph="on"))
    assert read_log(trainer.cfg.log_file)[-1]["graph"], "the step was not captured"
    assert len(graph) == len(eager) == 20
    np.testing.assert_allclose(graph, eager, rtol=1e-6, atol=0)


def test_graph_replay_matches_eager_with_a_chunked_head(tmp_path: Path) -> None:
    """LM_HEAD_CHUNK (64 rows a step in chunks of 24) replayed gives the eager steps' losses:
    each chunk's gradient scale is made on the device, not a host copy frozen at capture."""
    eager, _ = _losses(_config(tmp_path, "gpu", graph="off", lm_head_chunk=24))
    graph, trainer = _losses(_config(tmp_path, "gpu", graph="on", lm_head_chunk=24))
    assert read_log(trainer.cfg.log_file)[-1]["graph"], "the step was not captured"
    assert len(graph) == len(eager) == 20
    np.testing.assert_allclose(graph, eager, rtol=1e-6, atol=0)


def test_graph_replay_matches_eager_with_another_current_stream(tmp_path: Path) -> None:
    """CuPy's current stream is per thread: a GPU backend first made in another thread leaves
    this one on the default stream. The step must still launch CuPy's kernels on the stream it
    captures (else they run once at capture and every replay lacks them)."""
    import cupy

    eager, _ = _losses(_config(tmp_path, "gpu", graph="off"))
    cupy.cuda.Stream.null.use()
    try:
        graph, _ = _losses(_config(tmp_path, "gpu", graph="on"))
    finally:
        get_backend("gpu")  # current again for the tests after this one
    np.testing.assert_allclose(graph, eager, rtol=1e-6, atol=0)


def test_cpu_and_gpu_losses_agree(tmp_path: Path) -> None:
    cpu, _ = _losses(_config(tmp_path, "cpu"))
    gpu, trainer = _losses(_config(tmp_path, "gpu"))
    rel = np.abs(np.array(gpu) - np.array(cpu)) / np.abs(np.array(cpu))
    assert rel.max() < 1e-3, rel
    assert trainer.device == "gpu"


DROPOUTS = dict(dropout=0.2, embd_dropout=0.1, word_dropout=0.1)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dropout_mask_kernel_equals_numpys_philox(gpu: tuple[object, object], dtype: type) -> None:
    """The fused CUDA Philox and the shared array code draw identical bits."""
    from rustyflow_py.engine.ops.dropout import philox

    backend, ref = gpu
    shape = (3, 4, 37, 37)
    for step in (0, 1, 2**31 - 1):
        dev_step = backend.from_host(np.array(step, np.int32))  # type: ignore[attr-defined]
        fused = backend.kernels.dropout_mask(shape, dtype, 0.25, 2**32 - 1, 9, dev_step)
        on_device = ref.dropout_mask(shape, dtype, 0.25, 2**32 - 1, 9, dev_step)
        host = philox.dropout_mask(np, shape, dtype, 0.25, 2**32 - 1, 9,
                                   np.array(step, np.int32))
        np.testing.assert_array_equal(fused.get(), host)
        np.testing.assert_array_equal(on_device.get(), host)


def test_graph_replay_with_dropout_matches_eager(tmp_path: Path) -> None:
    """Replays draw fresh masks from the device step counter: the same losses as eager steps
    (which would not be true if every replay reused the captured step's masks)."""
    eager, _ = _losses(_config(tmp_path, "gpu", graph="off", **DROPOUTS))
    graph, trainer = _losses(_config(tmp_path, "gpu", graph="on", **DROPOUTS))
    assert read_log(trainer.cfg.log_file)[-1]["graph"], "the step was not captured"
    assert len(graph) == len(eager) == 20
    np.testing.assert_allclose(graph, eager, rtol=1e-6, atol=0)


def test_cpu_and_gpu_losses_agree_with_dropout(tmp_path: Path) -> None:
    cpu, _ = _losses(_config(tmp_path, "cpu", **DROPOUTS))
    gpu, trainer = _losses(_config(tmp_path, "gpu", **DROPOUTS))
    rel = np.abs(np.array(gpu) - np.array(cpu)) / np.abs(np.array(cpu))
    assert rel.max() < 1e-3, rel
    assert read_log(trainer.cfg.log_file)[-1]["graph"]
