"""Faults a newcomer meets: bad output paths, stop signals, resumes, diverged runs, the console.

Each test here failed on the trainer before these were handled: a run that trained to the end
and then lost its checkpoint or log block, a SIGTERM that left nothing, a tokens/s that counted
steps this process never ran.
"""

from __future__ import annotations

import math
import re
import signal
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import (
    STEPS_PER_EPOCH,
    TINY,
    interrupt_in_step,
    invoke,
    log_records,
    make_cfg,
    poison_weights_after,
    quiet,
    run_interrupted,
    signal_the_command,
)

from rustyflow_py.errors import RustyFlowError, TrainingError
from rustyflow_py.reporting import logfile
from rustyflow_py.training.outputs import checkpoint
from rustyflow_py.training.outputs.checkpoint import Checkpoint
from rustyflow_py.training.run import parts as run_parts
from rustyflow_py.training.run.loop import Trainer

pytestmark = pytest.mark.usefixtures("tiny_dir")

# ------------------------------------------------------------------------------ output paths


@pytest.mark.parametrize(("key", "value", "reason"), [
    ("MODEL_PATH", "/proc/rustyflow/model.npz", "cannot write the checkpoint"),
    ("MODEL_PATH", "/dev/full/model.npz", "cannot write the checkpoint"),
    ("LOG_FILE", "/dev/full", "is not a regular file"),
    ("LOG_FILE", "/proc/rustyflow/log.txt", "cannot append to the log file"),
])
def test_an_unwritable_output_fails_before_any_work(
    key: str, value: str, reason: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused before the first piece of work, reading the dataset, starts."""
    reads: list[str] = []

    def read_corpus(cfg: Any, *args: Any) -> None:
        reads.append(cfg.dataset)
        raise AssertionError("the dataset was read before the output was checked")

    monkeypatch.setattr(run_parts, "corpus_for_run", read_corpus)
    result = invoke("train", "--config", "tiny.env", f"--{key.lower().replace('_', '-')}", value)
    assert reads == []
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert line.startswith("Error: ") and reason in line and value.split("/")[1] in line
    assert "Traceback" not in result.output
    assert not Path("models").exists()


def test_a_folder_where_the_checkpoint_or_log_should_be_is_refused() -> None:
    Path("models/tiny-cpu.npz").mkdir(parents=True)
    with pytest.raises(TrainingError, match=r"checkpoint models/tiny-cpu.npz is a folder"):
        Trainer(make_cfg(), quiet)
    Path("logdir").mkdir()
    with pytest.raises(TrainingError, match=r"log file logdir is a folder"):
        Trainer(make_cfg(LOG_FILE="logdir"), quiet)


def test_a_checkpoint_that_cannot_be_saved_at_the_end_goes_to_a_fallback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    real_save = checkpoint.save

    def save(path: str, *args: Any) -> Path:
        if str(path).startswith("models/"):
            raise OSError(28, "No space left on device")
        return real_save(path, *args)

    monkeypatch.setattr(checkpoint, "save", save)
    messages: list[str] = []
    fallback = tmp_path / "tiny-cpu.npz"
    with pytest.raises(TrainingError, match=re.escape(
            f"the checkpoint (step 3) went to {fallback} instead of models/tiny-cpu.npz (No space "
            f"left")):
        Trainer(make_cfg(MAX_STEPS=3), quiet, warn=messages.append).run()
    [best, warning] = [m for m in messages if m.startswith("WARN")]
    assert "could not write the best checkpoint to models/tiny-cpu-best.npz" in best
    assert "could not write the checkpoint to models/tiny-cpu.npz (No space left on device)" in (
        warning)
    assert f"wrote it to {fallback} instead: the run will end failed" in warning
    assert Checkpoint(fallback).meta["train"]["step"] == 3  # a usable checkpoint
    record = log_records()[-1]
    assert record["status"] == "failed" and record["checkpoint"] == str(fallback)


def test_a_log_block_that_cannot_be_appended_goes_to_a_fallback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    real_append = logfile.append_block

    def append(path: str, text: str) -> None:
        if path == "log.txt":
            raise OSError(30, "Read-only file system")
        real_append(path, text)

    monkeypatch.setattr(logfile, "append_block", append)
    messages: list[str] = []
    fallback = tmp_path / "training_log.txt"
    with pytest.raises(TrainingError, match=re.escape(
            f"the log block went to {fallback} instead of log.txt (Read-only file system)")):
        Trainer(make_cfg(MAX_STEPS=3), messages.append).run()
    assert any(f"could not write the log block to log.txt (Read-only file system); wrote it to "
               f"{fallback} instead" in m for m in messages)
    record = log_records(fallback)[-1]  # the block at the fallback says the run failed
    assert record["steps"] == 3 and record["status"] == "failed"
    assert record["message"] == "the log block could not be appended to log.txt, so it is here"
    assert any(f"\nFull report: appended to {fallback} " in m for m in messages)


# ------------------------------------------------------------------------------ signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_sigterm_and_sigusr1_stop_like_ctrl_c_and_resume_exactly(signum: int) -> None:
    straight = Trainer(make_cfg(MODEL_PATH="models/a.npz"), quiet)
    straight.run()
    cfg = make_cfg(MODEL_PATH="models/b.npz")
    with pytest.raises(KeyboardInterrupt) as stopped:
        trainer = Trainer(cfg, quiet)
        interrupt_in_step(trainer, 9, signum)
        trainer.run()
    assert stopped.value.exit_code == 128 + signum  # type: ignore[attr-defined]
    record = log_records()[-1]
    assert record["status"] == "interrupted" and record["steps"] == 9
    resumed = Trainer(cfg, quiet, resume="models/b-cpu.npz")
    resumed.run()
    assert resumed.losses == straight.losses


def test_sigterm_to_the_command_exits_143_with_a_checkpoint_and_block(
    tiny_dir: Path,
) -> None:
    assert signal_the_command(tiny_dir, signal.SIGTERM) == 143
    [record] = log_records()
    assert record["status"] == "interrupted" and record["steps"] >= STEPS_PER_EPOCH
    assert Checkpoint("models/tiny-cpu.npz").meta["train"]["step"] == record["steps"]


# ------------------------------------------------------------------------------ resume


def test_tokens_per_s_after_resume_counts_only_this_process_s_steps() -> None:
    run_interrupted(make_cfg(NUM_EPOCHS=2, MAX_STEPS=40), 20)
    record = Trainer(make_cfg(NUM_EPOCHS=2, MAX_STEPS=40), quiet,
                     resume="models/tiny-cpu.npz").run()
    assert record["steps"] == 40 and record["steps_here"] == 20
    assert record["profile"] is None  # PROFILE=False: the run's own clock counts, no window
    tokens = 20 * TINY["BATCH_SIZE"] * TINY["SEQ_LEN"]
    # this process's 20 steps (not 40) over their own time: evaluation and checkpoint writes
    # are out of it, but were part of the run
    assert record["timed_steps"] == 20
    assert record["tokens_per_s"] * record["steps_time_s"] == pytest.approx(tokens)
    assert 0 < record["eval_time_s"]
    assert record["steps_time_s"] <= record["train_time_s"] - record["eval_time_s"] + 1e-9


def test_resuming_a_finished_run_says_nothing_is_left_and_appends_nothing() -> None:
    Trainer(make_cfg(), quiet).run()
    before = Path("log.txt").read_text()
    result = invoke("train", "--config", "tiny.env", "--resume", "models/tiny-cpu.npz")
    assert result.exit_code == 0, result.output
    assert "Nothing left to do" in result.output and "--num-epochs 2" in result.output
    assert Path("log.txt").read_text() == before
    longer = invoke("train", "--config", "tiny.env", "--resume", "models/tiny-cpu.npz",
                    "--num-epochs", "2")
    assert longer.exit_code == 0, longer.output
    assert "NUM_EPOCHS 1 -> 2" in longer.output
    assert log_records()[-1]["steps"] == 2 * STEPS_PER_EPOCH


def test_resume_with_a_changed_hyperparameter_warns_naming_it() -> None:
    run_interrupted(make_cfg(), 5)
    warned: list[str] = []
    Trainer(make_cfg(LEARNING_RATE=3e-3, GRAD_CLIP=0.5), quiet, resume="models/tiny-cpu.npz",
            warn=warned.append)
    [warning] = warned
    assert "no longer continues exactly" in warning
    assert "LEARNING_RATE 0.01 -> 0.003" in warning and "GRAD_CLIP 1.0 -> 0.5" in warning


@pytest.mark.parametrize("damage", ["shape", "missing", "short_state"])
def test_resume_from_a_damaged_checkpoint_is_one_clean_line(damage: str) -> None:
    run_interrupted(make_cfg(), 5)
    ckpt = Checkpoint("models/tiny-cpu.npz")
    weights, state = dict(ckpt.weights), dict(ckpt.optimizer)
    if damage == "shape":
        weights["wpe"] = weights["wpe"][:-1]
    elif damage == "missing":
        del weights["ln_f.bias"]
    else:
        state["m"] = state["m"][:10]
    checkpoint.save("models/bad.npz", weights, ckpt.meta, ckpt.vocab, state)
    result = invoke("train", "--config", "tiny.env", "--resume", "models/bad.npz")
    assert result.exit_code == 1
    assert "Traceback" not in result.output and "--resume" in result.output
    assert result.output.startswith("Error: ")


# ------------------------------------------------------------------------------ divergence


@pytest.mark.parametrize("grad_clip", [0.0, 1.0])
def test_a_diverged_run_reports_no_made_up_numbers_and_fitting_advice(
    monkeypatch: pytest.MonkeyPatch, grad_clip: float,
) -> None:
    poison_weights_after(monkeypatch, 5, 1e30)  # the next forward overflows
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # NumPy's overflow warnings stay quiet
        with pytest.raises(TrainingError, match=r"at step 6: training diverged") as failed:
            Trainer(make_cfg(GRAD_CLIP=grad_clip), quiet).run()
    assert ("set GRAD_CLIP" in str(failed.value)) == (grad_clip == 0.0)
    [record] = log_records()
    assert record["status"] == "failed"
    assert record["tokens_per_s"] is None and record["avg_epoch_time_s"] is None
    text = Path("log.txt").read_text()
    assert "[AVG_EPOCH_TIME]" not in text and "(extrapolated)" not in text
    assert "not estimated from a diverged run" in text


# ------------------------------------------------------------------------------ the console


class Recorder:
    """A progress display that records what the trainer told it."""

    def __init__(self) -> None:
        self.epochs: list[tuple[int, int, int]] = []
        self.evaluated: list[tuple[str, int]] = []

    def start_epoch(self, epoch: int, steps: int, done: int) -> None:
        self.epochs.append((epoch, steps, done))

    def update(self, *_: Any) -> None:
        pass

    def evaluating(self, split: str, tokens: int) -> Any:
        self.evaluated.append((split, tokens))
        return _Null()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def test_the_progress_total_honours_max_steps_and_evaluation_shows() -> None:
    progress = Recorder()
    Trainer(make_cfg(MAX_STEPS=7), quiet, progress=progress).run()
    assert progress.epochs == [(0, 7, 0)]
    assert [split for split, _ in progress.evaluated] == ["valid", "test"]
    assert all(tokens > 0 for _, tokens in progress.evaluated)


def test_eval_says_it_is_evaluating() -> None:
    Trainer(make_cfg(MAX_STEPS=3), quiet).run()
    result = invoke("eval", "--model", "models/tiny-cpu.npz", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "evaluating valid: " in result.output and "evaluated valid: " in result.output


def test_generate_and_chat_find_the_checkpoint_train_wrote() -> None:
    Trainer(make_cfg(MAX_STEPS=3), quiet).run()
    result = invoke("generate", "--config", "tiny.env", "--prompt", "the cat", "--max-tokens",
                    "3", "--device", "cpu")
    assert result.exit_code == 0, result.output
    given = invoke("generate", "--model", "models/tiny.npz", "--prompt", "the", "--device",
                   "cpu", "--max-tokens", "2")
    assert given.exit_code == 0, given.output
    assert "models/tiny.npz does not exist; using models/tiny-cpu.npz" in given.output
    Path("models/tiny-cpu.npz").unlink()
    Path("models/tiny-cpu-best.npz").unlink()  # else the log's completed run offers it
    no_prompt = invoke("generate", "--config", "tiny.env")  # stops before choosing a model
    assert no_prompt.exit_code != 0 and "--prompt" in no_prompt.output
    no_model = invoke("generate", "--config", "tiny.env", "--prompt", "the", "--device", "cpu")
    assert no_model.exit_code == 1 and "models/tiny-cpu.npz" in no_model.output


def test_version_and_expected_errors_without_traceback() -> None:
    version = invoke("--version")
    assert version.exit_code == 0 and version.output.startswith("rustyflow, version ")
    result = invoke("train", "--config", "tiny.env", "--dataset", "missing.txt")
    assert result.exit_code == 1 and result.output.startswith("Error: ")
    assert "Traceback" not in result.output
    assert issubclass(TrainingError, RustyFlowError)


def test_losses_stay_finite_after_all_this() -> None:
    """The happy path still trains: a guard that the fault handling costs nothing."""
    trainer = Trainer(make_cfg(MAX_STEPS=10), quiet)
    trainer.run()
    assert all(map(math.isfinite, trainer.losses)) and len(trainer.losses) == 10
    assert np.isfinite(trainer.history.val_ppl)


def test_the_banner_says_where_the_dataset_was_found(tiny_dir: Path) -> None:
    result = invoke("banner", "--config", "tiny.env")
    assert result.exit_code == 0, result.output
    assert f"  found in    {tiny_dir / 'tiny.txt'}" in result.output.splitlines()
