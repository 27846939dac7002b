"""Evaluation that serves quality: the best checkpoint, early stopping, the test perplexity of
the best weights, and sliding-window perplexity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import make_cfg, quiet

from rustyflow_py import data
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.reporting.log_writer import format_block
from rustyflow_py.training.checkpoint import Checkpoint
from rustyflow_py.training.evaluate import perplexity, windows
from rustyflow_py.training.loop import Trainer

pytestmark = pytest.mark.usefixtures("tiny_dir")


def scripted_validation(trainer: Trainer, values: list[float]) -> list[int]:
    """Make the trainer's validations return `values` in turn; the steps they ran at."""
    real, steps = trainer.evaluate, []

    def evaluate(split: str) -> float:
        if split != "valid":
            return real(split)
        steps.append(trainer.pos.step)
        return values[len(steps) - 1]

    trainer.evaluate = evaluate  # type: ignore[method-assign]
    return steps


def test_best_checkpoint_follows_the_best_validation() -> None:
    trainer = Trainer(make_cfg(EVAL_INTERVAL=5, MAX_STEPS=20), quiet)
    steps = scripted_validation(trainer, [9.0, 7.0, 8.0, 7.5])
    record = trainer.run()
    assert steps == [5, 10, 15, 20]
    best = Path("models/tiny-cpu-best.npz")
    assert Checkpoint(best).meta["train"]["step"] == 10
    assert record["best_val_ppl"] == 7.0 and record["best_step"] == 10
    assert record["test_ppl_of"] == "best (step 10)" and not record["early_stopped"]
    assert record["best_checkpoint"] == str(best)
    final = Checkpoint("models/tiny-cpu.npz")
    assert final.meta["train"]["step"] == 20  # the last weights stay the resumable checkpoint
    assert not all(np.array_equal(final.weights[k], Checkpoint(best).weights[k])
                   for k in final.weights)
    # the test perplexity is the best weights' own
    again = Trainer(make_cfg(MODEL_PATH="models/again.npz"), quiet)  # its own checkpoint
    again.model.buffer.load_state_dict(Checkpoint(best).weights)
    assert again.evaluate("test") == record["test_ppl"]
    block = format_block(record)
    assert ("Evaluation: non-overlapping 16-token windows | best val ppl 7.00 at step 10 "
            f"({best}) | test ppl") in block and "of best (step 10)" in block


def test_patience_stops_after_that_many_validations_without_a_new_best() -> None:
    messages: list[str] = []
    trainer = Trainer(make_cfg(EVAL_INTERVAL=3, PATIENCE=2, NUM_EPOCHS=3), messages.append)
    steps = scripted_validation(trainer, [9.0, 6.0, 6.5, 6.0, 1.0])
    record = trainer.run()
    assert steps == [3, 6, 9, 12]
    assert trainer.pos.step == 12 and record["early_stopped"]
    assert record["message"].startswith("early-stopped at step 12: no better validation in 2 ")
    assert record["test_ppl_of"] == "best (step 6)"
    assert read_log("log.txt")[-1]["status"] == "completed"
    assert any(m.startswith("early-stopped at step 12") for m in messages)


def test_without_patience_training_runs_to_the_end() -> None:
    trainer = Trainer(make_cfg(EVAL_INTERVAL=3, MAX_STEPS=12), quiet)
    scripted_validation(trainer, [9.0, 9.5, 9.6, 9.7, 9.8])
    record = trainer.run()
    assert trainer.pos.step == 12 and not record["early_stopped"]
    assert record["test_ppl_of"] == "best (step 3)"


@pytest.fixture
def model_and_stream() -> tuple[GPT, Any]:
    model = GPT(GPTConfig(vocab_size=30, seq_len=8, n_layer=1, n_head=2, n_embd=16), "cpu", 4)
    tokens = np.random.default_rng(2).integers(0, 30, 3 * 101).astype(np.int32)
    return model, data.batchify(tokens, 3)


def test_sliding_windows_at_stride_seq_len_are_the_non_overlapping_ones(
        model_and_stream: tuple[GPT, Any]) -> None:
    model, stream = model_and_stream
    plain, strided = perplexity(model, stream, 8), perplexity(model, stream, 8, stride=8)
    assert plain["perplexity"] == strided["perplexity"]
    assert plain["tokens"] == strided["tokens"] == 3 * 8 * 12  # 12 windows of (101 - 1) // 8
    assert plain["protocol"] == "non-overlapping 8-token windows"


def test_sliding_windows_score_each_token_once_with_more_context(
        model_and_stream: tuple[GPT, Any]) -> None:
    model, stream = model_and_stream
    spans = windows(101, 8, 3)
    scored = [t for start, first in spans for t in range(start + first, start + 8)]
    assert scored == list(range(len(scored)))  # every position once, in order
    assert all(first == 5 for _, first in spans[1:])
    result = perplexity(model, stream, 8, stride=3)
    assert result["tokens"] == 3 * len(scored)
    assert result["protocol"] == "sliding 8-token windows, stride 3"
    assert np.isfinite(result["perplexity"])


def test_the_seed_recipe_trains_three_steps_on_the_cpu(tmp_path: Path) -> None:
    """configs/seed.env as shipped, but on a small generated corpus: WikiText-2's full
    validation and test passes would dominate the suite's time on the CPU."""
    from conftest import REPO_ROOT

    from rustyflow_py.training.config import load_config

    corpus = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    corpus.write_text("\n".join(" ".join(f"w{i}" for i in rng.integers(0, 300, 12))
                                for _ in range(2000)))
    cfg, _ = load_config(REPO_ROOT / "configs" / "seed.env", {
        "MAX_STEPS": 3, "DEVICE": "cpu", "DATASET": str(corpus), "PROFILE": False,
        "LOG_FILE": str(tmp_path / "log.txt"), "MODEL_PATH": str(tmp_path / "m.npz")},
        environ={})
    record = Trainer(cfg, quiet).run()
    assert record["steps"] == 3 and np.isfinite(record["test_ppl"])
    assert (cfg.seq_len, cfg.embed_dim, cfg.num_layers) == (64, 128, 2)
