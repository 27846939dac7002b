"""The quality features on the GPU: inside the captured step (EMA, the scheduled weight decay,
locked dropout, label smoothing, the random-offset batch gather) replays equal eager steps,
match the CPU, and transfer nothing. Skipped without a usable GPU (CuPy and a device)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_gpu import _config, _losses, steps_transfer_nothing

from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.model.ema import EMA
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.model.optim import AdamW, Schedule
from rustyflow_py.model.wd_schedule import DecaySchedule
from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.training.outputs.checkpoint import Checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason())),
]

QUALITY = dict(dropout=0.2, locked_dropout=True, label_smoothing=0.1, ema_decay=0.9,
               ema_start=2, wd_schedule="cosine", wd_final=0.01, random_offsets=True)


def _ema(trainer: Any) -> np.ndarray:
    return Checkpoint(trainer.checkpoint_path).averages["ema"]


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_graph_replay_with_the_quality_keys_matches_eager(tmp_path: Path, optimizer: str) -> None:
    eager, first = _losses(_config(tmp_path, "gpu", graph="off", optimizer=optimizer,
                                   **QUALITY))
    ema_eager = _ema(first)
    graph, trainer = _losses(_config(tmp_path, "gpu", graph="on", optimizer=optimizer,
                                     **QUALITY))
    assert read_log(trainer.cfg.log_file)[-1]["graph"], "the step was not captured"
    assert len(graph) == len(eager) == 20
    np.testing.assert_allclose(graph, eager, rtol=1e-6, atol=0)
    # Replay and eager agree to the losses' 1e-6, not to the bit, and Adam turns a last-bit
    # difference in a near-zero gradient into an update of up to the learning rate: the
    # averages agree to a hundredth of one step's largest update (measured on an H100: within
    # a third of that, in under 1% of the elements).
    lr = trainer.cfg.learning_rate
    np.testing.assert_allclose(_ema(trainer), ema_eager, rtol=0, atol=1e-2 * lr)


def test_cpu_and_gpu_agree_with_the_quality_keys(tmp_path: Path) -> None:
    cpu, on_cpu = _losses(_config(tmp_path, "cpu", **QUALITY))
    ema_cpu = _ema(on_cpu)
    gpu, on_gpu = _losses(_config(tmp_path, "gpu", **QUALITY))
    rel = np.abs(np.array(gpu) - np.array(cpu)) / np.abs(np.array(cpu))
    assert rel.max() < 1e-3, rel
    # The devices' float32 sums differ in order, so their weights drift apart by ulps a step;
    # the average agrees to the losses' bound, relative to the weights' own scale (an element
    # near zero cannot be held to a relative bound).
    scale = np.abs(ema_cpu).max()
    np.testing.assert_allclose(_ema(on_gpu), ema_cpu, rtol=0, atol=1e-3 * scale)


def test_a_quality_step_makes_no_transfers() -> None:
    cfg = GPTConfig(vocab_size=101, seq_len=16, n_layer=2, n_head=2, n_embd=32, dropout=0.2,
                    locked_dropout=True, label_smoothing=0.1)
    model = GPT(cfg, "gpu", seed=0)
    opt = AdamW(model.buffer, Schedule(1e-3, 2, 10, 0.1), weight_decay=0.0)
    opt.decay_schedule = DecaySchedule("linear", 0.1, 0.0, 10)
    steps_transfer_nothing(model, opt, EMA(model.buffer, 0.99).after_step)
