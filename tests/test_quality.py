"""The quality features (docs/quality.md): weight averaging (EMA_DECAY, AVERAGE_LAST_K), the
weight-decay schedule, locked dropout and label smoothing, held to NumPy (and torch)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import log_records, make_cfg, quiet
from test_gradcheck import gradcheck

from rustyflow_py.engine import ops
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.regularize import locked_dropout, smoothed
from rustyflow_py.engine.tensor import Tensor
from rustyflow_py.model.ema import EMA
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.model.optim import AdamW, Muon, Schedule
from rustyflow_py.model.snapshots import SnapshotAverage, mean_of
from rustyflow_py.model.wd_schedule import DecaySchedule
from rustyflow_py.training.config.config import ConfigError
from rustyflow_py.training.evaluation.evaluate import load_model
from rustyflow_py.training.outputs.checkpoint import Checkpoint
from rustyflow_py.training.run.loop import Trainer

RNG = np.random.default_rng(32)
CFG = GPTConfig(vocab_size=50, seq_len=8, n_layer=2, n_head=2, n_embd=16)


def _batch(rng: np.random.Generator) -> tuple[Tensor, Tensor]:
    x = rng.integers(0, CFG.vocab_size, (3, CFG.seq_len)).astype(np.int32)
    return Tensor(x), Tensor(np.roll(x, -1, axis=1))


def _train(model: GPT, opt: Any, steps: int, after: Any = None) -> list[np.ndarray]:
    """`steps` AdamW steps on random batches; the weights after each (host copies)."""
    rng, seen = np.random.default_rng(0), []
    for _ in range(steps):
        model.buffer.zero_grad()
        model(*_batch(rng)).backward()
        opt.step()
        if after is not None:
            after(opt.step_count)
        seen.append(model.buffer.backend.to_host(model.buffer.flat).copy())
    return seen


# ---- EMA ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ema_kernel_equals_numpy(device: str, dtype: Any) -> None:
    backend = get_backend(device)
    p, ema = RNG.standard_normal(1000).astype(dtype), RNG.standard_normal(1000).astype(dtype)
    c = dtype(1.0 - 0.99)
    for step, start, expected in ((3, 5, p), (5, 5, p), (6, 5, ema + c * (p - ema))):
        out = backend.from_host(ema.copy())
        backend.kernels.ema_update(out, backend.from_host(p), 0.99, backend.from_host(
            np.array(step, np.int32)), start)
        got = backend.to_host(out)
        if device == "cpu":
            np.testing.assert_array_equal(got, expected)
        else:  # CUDA may fuse the multiply-add (one rounding fewer)
            np.testing.assert_allclose(got, expected, rtol=4 * np.finfo(dtype).eps)


@pytest.mark.parametrize("start", [0, 3])
def test_ema_over_training_equals_a_numpy_reference(start: int) -> None:
    model = GPT(CFG, "cpu", seed=1)
    ema = EMA(model.buffer, 0.9, start)
    w0 = model.buffer.flat.copy()
    seen = _train(model, AdamW(model.buffer, Schedule(1e-2, 2, 10, 0.1)), 8, ema.after_step)
    ref, c = w0.copy(), np.float32(1.0 - 0.9)
    for step, w in enumerate(seen, start=1):
        ref = w.copy() if step <= start else ref + c * (w - ref)
    np.testing.assert_array_equal(ema.flat, ref)
    assert not np.array_equal(ema.flat, seen[-1])  # it is an average, not the weights


def test_ema_swaps_in_and_back() -> None:
    model = GPT(CFG, "cpu", seed=1)
    ema = EMA(model.buffer, 0.5)
    ema.flat[...] = 3.0
    raw = model.buffer.flat.copy()
    with ema.swapped_in():
        np.testing.assert_array_equal(model.p["wte"].numpy(), 3.0)
    np.testing.assert_array_equal(model.buffer.flat, raw)


# ---- AVERAGE_LAST_K -------------------------------------------------------------------------
def test_snapshot_average_is_the_mean_of_the_last_k() -> None:
    model = GPT(CFG, "cpu", seed=1)
    avg, raw, seen = SnapshotAverage(model.buffer, 3), model.buffer.flat.copy(), []
    for _ in range(5):
        model.buffer.flat[...] = RNG.standard_normal(model.buffer.flat.size)
        seen.append(model.buffer.flat.copy())
        avg.at_validation()
    model.buffer.flat[...] = raw
    expected = (np.stack(seen[-3:]).astype(np.float64).sum(axis=0) / 3).astype(np.float32)
    np.testing.assert_array_equal(mean_of(avg.ring, np.float32), expected)
    with avg.swapped_in():
        np.testing.assert_array_equal(model.buffer.flat, expected)
    np.testing.assert_array_equal(model.buffer.flat, raw)
    restored = SnapshotAverage(model.buffer, 3)
    assert restored.load_state_dict(avg.state_dict())
    np.testing.assert_array_equal(mean_of(restored.ring, np.float32), expected)


def test_averaging_keys_are_one_at_a_time() -> None:
    with pytest.raises(ConfigError, match="choose one"):
        make_cfg(EMA_DECAY=0.99, AVERAGE_LAST_K=3)


# ---- the run: best checkpoint, test, resume -------------------------------------------------
pytestmark_run = pytest.mark.usefixtures("tiny_dir")


@pytestmark_run
@pytest.mark.parametrize("keys, kind", [({"EMA_DECAY": 0.9}, "EMA"),
                                        ({"AVERAGE_LAST_K": 2}, "last 2 validations")])
def test_the_best_checkpoint_holds_the_averaged_weights(keys: dict[str, Any], kind: str) -> None:
    cfg = make_cfg(NUM_EPOCHS=3, **keys)
    trainer = Trainer(cfg, quiet)
    trainer.run()
    assert trainer.history.best_step == trainer.history.pos.step  # the tiny corpus keeps improving
    last, best = Checkpoint(trainer.checkpoint_path), Checkpoint(trainer.parts.best_path)
    assert kind in best.meta["averaged"] and kind in trainer.state.test_ppl_of
    avg = last.averages
    averaged = (avg["ema"] if "ema" in avg else
                mean_of([avg["snapshot.0"], avg["snapshot.1"]], np.float32))
    flat = np.concatenate([best.weights[s.name].ravel() for s in trainer.model.buffer.spans])
    np.testing.assert_array_equal(flat, averaged)
    raw = np.concatenate([last.weights[s.name].ravel() for s in trainer.model.buffer.spans])
    assert not np.array_equal(raw, averaged)  # the resumable checkpoint keeps the raw weights
    model, _, _ = load_model(trainer.parts.best_path, "cpu")  # eval/generate load it as usual
    np.testing.assert_array_equal(model.buffer.flat, averaged)
    assert math.isclose(trainer.history.val_ppl, trainer.history.best_val_ppl)


@pytestmark_run
@pytest.mark.parametrize("keys", [{"EMA_DECAY": 0.8, "EMA_START": 4}, {"AVERAGE_LAST_K": 2}])
def test_resume_continues_the_average_exactly(keys: dict[str, Any]) -> None:
    straight = make_cfg(NUM_EPOCHS=2, EVAL_INTERVAL=10, DROPOUT=0.1, MODEL_PATH="a.npz", **keys)
    whole = Trainer(straight, quiet)
    whole.run()
    # stopped at a validation step: a run's end validates, and AVERAGE_LAST_K's ring holds
    # the weights of every validation, so a stop elsewhere adds one the straight run lacks
    part = make_cfg(NUM_EPOCHS=2, EVAL_INTERVAL=10, DROPOUT=0.1, MODEL_PATH="b.npz",
                    MAX_STEPS=20, **keys)
    Trainer(part, quiet).run()
    warned: list[str] = []
    resumed = Trainer(make_cfg(NUM_EPOCHS=2, EVAL_INTERVAL=10, DROPOUT=0.1,
                               MODEL_PATH="b.npz", **keys),
                      quiet, resume="b-cpu.npz", warn=warned.append)
    resumed.run()
    assert warned == []
    assert resumed.losses == whole.losses
    a, b = Checkpoint("a-cpu.npz").averages, Checkpoint("b-cpu.npz").averages
    assert sorted(a) == sorted(b) and a
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert resumed.history.val_curve == whole.history.val_curve


@pytestmark_run
def test_resume_without_a_saved_average_says_it_starts_there() -> None:
    Trainer(make_cfg(MAX_STEPS=5), quiet).run()
    warned: list[str] = []
    Trainer(make_cfg(MAX_STEPS=8, EMA_DECAY=0.9), quiet, resume="models/tiny-cpu.npz",
            warn=warned.append).run()
    assert any("holds no weight average" in w for w in warned)


# ---- WD_SCHEDULE ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_decay_schedule_values(kind: str) -> None:
    sched = DecaySchedule(kind, 0.2, 0.05, 100)
    for step in (0, 25, 50, 100, 150):
        progress = min(step / 100, 1.0)
        left = 1 - progress if kind == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        assert math.isclose(float(sched(step)), 0.05 + 0.15 * left, rel_tol=1e-6)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_flat_schedule_equals_constant_decay(optimizer: str) -> None:
    """linear from WEIGHT_DECAY to WEIGHT_DECAY is the fused kernels' constant decay: the
    separate pass applies exactly what the kernels would, bit for bit (float32)."""
    runs = []
    for scheduled in (False, True):
        model = GPT(CFG, "cpu", seed=4)
        sched = Schedule(1e-2, 2, 10, 0.1)
        if optimizer == "adamw":
            opt: Any = AdamW(model.buffer, sched, weight_decay=0.0 if scheduled else 0.3)
        else:
            hidden = tuple(s.name for s in model.buffer.spans
                           if s.name.startswith("h.") and len(s.shape) == 2)
            opt = Muon(model.buffer, sched, Schedule(0.02, 2, 10, 0.1), hidden,
                       weight_decay=0.0 if scheduled else 0.3)
        if scheduled:
            opt.decay_schedule = DecaySchedule("linear", 0.3, 0.3, 10)
        runs.append(_train(model, opt, 5)[-1])
    np.testing.assert_array_equal(runs[1], runs[0])


def test_a_decay_schedule_decays_towards_its_final_value() -> None:
    """With gradients and moments at zero only the decay moves the weights: after a step at
    learning rate lr, each decayed weight is w * (1 - lr * wd(step))."""
    model = GPT(CFG, "cpu", seed=4, dtype=np.float64)
    opt = AdamW(model.buffer, Schedule(0.5, 0, 4, 1.0), weight_decay=0.0, grad_clip=0.0)
    opt.decay_schedule = DecaySchedule("linear", 0.4, 0.0, 4)
    buf = model.buffer
    for step in range(1, 5):
        before = buf.flat.copy()
        buf.zero_grad()
        opt.step()
        wd = np.float32(0.4 * (1 - step / 4))
        factor = (1.0 - np.float32(0.5) * wd).astype(np.float64)
        np.testing.assert_array_equal(buf.flat[: buf.decay_size], before[: buf.decay_size] * factor)
        np.testing.assert_array_equal(buf.flat[buf.decay_size :], before[buf.decay_size :])


def test_a_decay_schedule_needs_decoupled_decay() -> None:
    with pytest.raises(ConfigError, match="WD_SCHEDULE=cosine"):
        make_cfg(WD_SCHEDULE="cosine", OPTIMIZER="sgd")


# ---- LOCKED_DROPOUT -------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.1, 0.4])
def test_locked_masks_are_shared_over_time_at_rate_p(device: str, p: float) -> None:
    b, t, e = 8, 12, 512
    backend = get_backend(device)
    x = Tensor(np.ones((b, t, e), np.float32), device=device)
    kept = []
    for step in range(3):
        rng = ops.Randomness(5, backend.from_host(np.array(step, np.int32)))
        out = locked_dropout(x, p, rng, site=3).numpy()
        np.testing.assert_array_equal(out, np.broadcast_to(out[:, :1], out.shape))  # over T
        assert set(np.unique(out)) <= {0.0, np.float32(1 / (1 - p))}
        kept.append(out[:, 0] != 0)
        n = b * e  # independent draws: one per sequence and feature
        assert abs(kept[-1].mean() - (1 - p)) < 4 * math.sqrt(p * (1 - p) / n)
    assert not np.array_equal(kept[0], kept[1])  # fresh masks every step
    other = locked_dropout(x, p, ops.Randomness(5, backend.from_host(np.array(2, np.int32))),
                           site=4).numpy()
    assert not np.array_equal(other[:, 0] != 0, kept[2])  # and per site


def test_locked_dropout_gradient(device: str) -> None:
    rng = ops.Randomness(2, get_backend(device).from_host(np.array(7, np.int32)))
    gradcheck(device, lambda x: locked_dropout(x, 0.3, rng, site=1),
              [RNG.standard_normal((2, 5, 6))])


def test_locked_dropout_replaces_the_elementwise_sites() -> None:
    idx, tgt = _batch(np.random.default_rng(3))
    losses = []
    for locked in (False, True):
        model = GPT(GPTConfig(**{**CFG.__dict__, "dropout": 0.3, "locked_dropout": locked}),
                    "cpu", seed=1)
        losses.append(float(model(idx, tgt).data))
        model.training = False
        losses.append(float(model(idx, tgt).data))
    assert losses[0] != losses[2] and losses[1] == losses[3]  # evaluation drops nothing


# ---- LABEL_SMOOTHING ------------------------------------------------------------------------
def _smoothed_loss(h: Tensor, w: Tensor, t: Tensor, eps: float) -> Tensor:
    return smoothed(ops.lm_head_cross_entropy(h, w, t), h, w, t, eps)


def test_label_smoothing_gradient(device: str) -> None:
    t = Tensor(RNG.integers(0, 7, 6).astype(np.int32), device=device)
    gradcheck(device, lambda h, w: _smoothed_loss(h, w, t, 0.2),
              [RNG.standard_normal((6, 4)), RNG.standard_normal((7, 4))])


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_label_smoothing_matches_torch(device: str, eps: float) -> None:
    torch = pytest.importorskip("torch")
    h, w = RNG.standard_normal((12, 8)), RNG.standard_normal((30, 8))
    t = RNG.integers(0, 30, 12)
    th, tw = torch.tensor(h, requires_grad=True), torch.tensor(w, requires_grad=True)
    ref = torch.nn.functional.cross_entropy(th @ tw.T, torch.from_numpy(t), label_smoothing=eps)
    ref.backward()
    oh = Tensor(h, requires_grad=True, device=device)
    ow = Tensor(w, requires_grad=True, device=device)
    loss = _smoothed_loss(oh, ow, Tensor(t.astype(np.int32), device=device), eps)
    loss.backward()
    np.testing.assert_allclose(float(loss.numpy()), ref.item(), rtol=1e-12)
    backend = oh.backend
    np.testing.assert_allclose(backend.to_host(oh.grad), th.grad.numpy(), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(backend.to_host(ow.grad), tw.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_evaluation_never_includes_label_smoothing() -> None:
    idx, tgt = _batch(np.random.default_rng(5))
    plain = GPT(CFG, "cpu", seed=1)
    smooth = GPT(GPTConfig(**{**CFG.__dict__, "label_smoothing": 0.2}), "cpu", seed=1)
    assert float(smooth(idx, tgt).data) != float(plain(idx, tgt).data)  # training: smoothed
    plain.training = smooth.training = False
    assert float(smooth(idx, tgt).data) == float(plain(idx, tgt).data)  # perplexity: plain NLL


@pytestmark_run
def test_a_run_with_every_key_on_completes(tiny_dir: Path) -> None:
    cfg = make_cfg(MAX_STEPS=12, DROPOUT=0.2, LOCKED_DROPOUT=True, LABEL_SMOOTHING=0.1,
                   EMA_DECAY=0.9, WD_SCHEDULE="cosine", WD_FINAL=0.01)
    trainer = Trainer(cfg, quiet)
    trainer.run()
    assert len(trainer.losses) == 12 and all(map(math.isfinite, trainer.losses))
    assert trainer.state.test_ppl is not None and math.isfinite(trainer.state.test_ppl)
    # the record says what regularised the run, each site at the rate it ran with
    record = log_records(cfg.log_file)[-1]
    assert record["regularisation"] == {
        "embd_dropout": 0.2, "attn_dropout": 0.2, "resid_dropout": 0.2, "word_dropout": 0.0,
        "locked_dropout": True, "random_offsets": False, "label_smoothing": 0.1,
        "ema_decay": 0.9, "ema_start": 0, "average_last_k": 0}
    assert record["seed"] == cfg.seed
