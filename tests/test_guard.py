"""The pieces behind the fault matrix, one at a time: the size estimate, the loss-scale
collapse rule, the run lock, ownership marks and fallback names."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import make_cfg

from rustyflow_py.errors import TrainingError
from rustyflow_py.model.gpt import build_model
from rustyflow_py.model.loss_scale import COLLAPSE_FLOOR, COLLAPSE_STREAK, LossScaler
from rustyflow_py.training.outputs import ownership
from rustyflow_py.training.outputs.lock import RunLock
from rustyflow_py.training.outputs.ownership import same_recipe
from rustyflow_py.training.outputs.writing import fallbacks
from rustyflow_py.training.start import sizing

pytestmark = pytest.mark.usefixtures("tiny_dir")


@pytest.mark.parametrize("shape", [
    {}, {"NUM_LAYERS": 3, "EMBED_DIM": 48, "NUM_HEADS": 4}, {"SEQ_LEN": 7, "EMBED_DIM": 8},
])
def test_the_estimate_counts_the_parameters_a_model_has(shape: dict[str, int]) -> None:
    cfg = make_cfg(**shape)
    assert sizing.num_params(cfg, 37) == build_model(cfg, 37).num_params()


def test_the_estimate_grows_with_each_knob_it_names() -> None:
    base = sizing.estimate(make_cfg(), 50, gpu=False)
    for knob in ({"BATCH_SIZE": 8}, {"SEQ_LEN": 32}, {"EMBED_DIM": 64}, {"NUM_LAYERS": 2},
                 {"EMA_DECAY": 0.99}):
        assert sizing.estimate(make_cfg(**knob), 50, gpu=False).total > base.total, knob
    sgd = sizing.estimate(make_cfg(OPTIMIZER="sgd", MOMENTUM=0.0), 50, gpu=False)
    assert sgd.parts["optimizer state"] == 0 < base.parts["optimizer state"]
    # the bf16 copy the collectives carry: 2 bytes a parameter, on GPUs over several processes
    gpu_cfg = {"DEVICE": "gpu", "PRECISION": "bf16"}
    wire = sizing.estimate(make_cfg(GRAD_REDUCE_DTYPE="bf16", **gpu_cfg), 50, gpu=True,
                           world_size=2)
    assert wire.parts["bf16 gradient copy"] == 2 * wire.params
    assert "bf16 gradient copy" not in sizing.estimate(make_cfg(**gpu_cfg), 50, gpu=True,
                                                       world_size=2).parts
    bf16 = sizing.estimate(make_cfg(ADAM_STATE_DTYPE="bf16", **gpu_cfg), 50, gpu=True)
    assert 2 * bf16.parts["optimizer state"] == sizing.estimate(
        make_cfg(**gpu_cfg), 50, gpu=True).parts["optimizer state"]  # bf16 moments: half
    # LM_HEAD_CHUNK: the logits of 4 rows at a time, not of all 2 x 16, and dW's float32 sum
    whole = sizing.estimate(make_cfg(BATCH_SIZE=2, SEQ_LEN=16), 5000, gpu=False)
    chunked = sizing.estimate(make_cfg(BATCH_SIZE=2, SEQ_LEN=16, LM_HEAD_CHUNK=4), 5000,
                              gpu=False)
    logits = whole.parts["activations"] - chunked.parts["activations"]
    assert logits == 2 * 5000 * (32 - 4) * 4
    assert chunked.parts["LM head's dW sum"] == 5000 * make_cfg().embed_dim * 4


def _overflow(scaler: LossScaler, steps: int) -> str | None:
    for _ in range(steps):
        scaler.update(np.float32(np.inf))
    return scaler.collapse(np.asarray)


def test_the_loss_scale_collapses_after_a_streak_of_skips_or_below_the_floor() -> None:
    high = LossScaler(np, init_scale=2.0**60)  # stays above the floor for the whole streak
    assert _overflow(high, COLLAPSE_STREAK - 1) is None
    assert _overflow(high, 1) == f"{COLLAPSE_STREAK} steps in a row were skipped for " \
                                  "overflowing gradients"
    low = LossScaler(np, init_scale=COLLAPSE_FLOOR * 4)
    assert _overflow(low, 2) is None
    assert "fell below" in str(_overflow(low, 1))
    clean = LossScaler(np, init_scale=2.0**60)
    _overflow(clean, COLLAPSE_STREAK - 1)
    clean.update(np.float32(1.0))  # a clean step ends the streak
    assert _overflow(clean, COLLAPSE_STREAK - 1) is None


def test_a_held_lock_names_its_holder_and_a_released_one_is_free(tiny_dir: Path) -> None:
    first, warned = RunLock(), []
    first.acquire("model.npz", "checkpoint", warned.append)
    with pytest.raises(TrainingError, match=rf"checkpoint model.npz is in use by pid "
                                            rf"{os.getpid()} since \S+Z"):
        RunLock().acquire("model.npz", "checkpoint", warned.append)
    first.release()
    assert not Path("model.npz.lock").exists()
    again = RunLock()
    again.acquire("model.npz", "checkpoint", warned.append)
    again.release()
    assert warned == []  # nothing was stale


def test_marks_tell_rustyflow_files_from_others(tiny_dir: Path) -> None:
    Path("log.txt").write_text("")
    assert ownership.is_log(Path("log.txt"))
    Path("log.txt").write_text("=== RustyFlow run 2026 | completed\n")
    assert ownership.is_log(Path("log.txt"))
    Path("notes.txt").write_text("shopping list\n")
    assert not ownership.is_log(Path("notes.txt"))
    assert not ownership.is_trace(Path("notes.txt"))
    Path("t.json").write_text('{"otherData":{"producer":"rustyflow train --trace"}}')
    assert ownership.is_trace(Path("t.json"))
    np.savez("their.npz", meta=np.array('{"format": 2}'))
    assert ownership.checkpoint_meta("their.npz") is None


def test_a_fallback_place_never_names_an_existing_file(tiny_dir: Path) -> None:
    Path("m.npz").write_text("someone's")
    Path("m-rescued1.npz").write_text("someone else's")
    assert fallbacks("models/m.npz")[0] == tiny_dir / "m-rescued2.npz"


class _Pool:
    def free_bytes(self) -> int:
        return 2**30  # cached by CuPy, free for the run


class _Device:
    def __init__(self, index: int) -> None:
        self.index = index

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *_: object) -> None:
        return None


class _FakeCupy:
    """What the size check reads of CuPy: memGetInfo on a device, the pool's free bytes."""

    cuda = SimpleNamespace(Device=_Device,
                           runtime=SimpleNamespace(memGetInfo=lambda: (7 * 2**30, 80 * 2**30)))

    @staticmethod
    def get_default_memory_pool() -> _Pool:
        return _Pool()


def test_the_gpu_check_compares_with_free_device_memory() -> None:
    gpu = SimpleNamespace(kind="gpu", index=0, xp=_FakeCupy, hardware=lambda: "Fake GPU")
    sizing.check_fits(make_cfg(), 50, gpu)  # a tiny model fits
    huge = make_cfg(NUM_LAYERS=48, EMBED_DIM=8192, NUM_HEADS=8)
    millions = f"{sizing.num_params(huge, 50) / 1e6:,.1f}"
    with pytest.raises(TrainingError, match=rf"training L48 E8192 \(vocabulary 50\), "
                       rf"{millions} M parameters needs about [\d.]+ GiB of GPU memory \(Fake "
                       r"GPU\) \(parameters .*CUDA graph pool .*\), but 8.0 GiB is free: "
                       r"reduce EMBED_DIM or NUM_LAYERS \(the model\)\Z"):
        sizing.check_fits(huge, 50, gpu)
    long = make_cfg(BATCH_SIZE=4096, SEQ_LEN=512)  # activations dominate
    with pytest.raises(TrainingError, match=r"reduce BATCH_SIZE or SEQ_LEN \(the "
                                            r"activations\), or use PRECISION=bf16"):
        sizing.check_fits(long, 50, gpu)


def test_the_same_command_after_an_upgrade_is_the_same_run() -> None:
    """A checkpoint written before a key existed stored no value for it: the same command
    (that key at its default) is the same run, any other value is not."""
    current = make_cfg().to_dict()
    new_key = "LABEL_SMOOTHING"
    older = {k: v for k, v in current.items() if k != new_key}
    assert same_recipe(json.loads(json.dumps(current)), current)
    assert same_recipe(older, current)
    assert not same_recipe(older, {**current, new_key: 0.1})
    assert not same_recipe({**older, "LEARNING_RATE": 0.5}, current)
    assert not same_recipe({**current, "A_REMOVED_KEY": 1}, current)
    assert not same_recipe(None, current)


def test_fp8_scaling_changes_no_run_without_fp8() -> None:
    """FP8_SCALING's default became delayed: a bf16 run stored with current (the old
    default) is the same run as today's command; an fp8 run stored with current is not."""
    bf16 = make_cfg(PRECISION="bf16").to_dict()
    assert bf16["FP8_SCALING"] == "delayed"
    assert same_recipe({**bf16, "FP8_SCALING": "current"}, bf16)
    fp8 = {**bf16, "PRECISION": "fp8"}
    assert not same_recipe({**fp8, "FP8_SCALING": "current"}, fp8)
    assert not same_recipe({**bf16, "FP8_SCALING": "current"}, fp8)
