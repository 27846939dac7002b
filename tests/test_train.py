"""Training end to end: a tiny GPT on a tiny corpus, exact resume, interruption, divergence,
the log, the CLI, the device fallback, the shell wrappers, and a few real WikiText-2 steps.

Most tests train a 1-layer, 32-wide model on a few hundred lines of repetitive text written to
tmp_path (29 steps per epoch, well under a second), so they can afford to check behaviour
exactly: bitwise-equal losses and weights after a resume, the exact step a NaN is reported at.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import real_data_dir
from helpers import (
    REPO,
    STEPS_PER_EPOCH,
    TINY,
    env_file,
    invoke,
    log_records,
    make_cfg,
    poison_weights_after,
    quiet,
    run_interrupted,
    signal_the_command,
    subprocess_env,
)

from rustyflow_py import data
from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.library import get_backend
from rustyflow_py.errors import TrainingError
from rustyflow_py.model.optim import AdamW
from rustyflow_py.reporting.record_schema import BLOCK_END, BLOCK_START
from rustyflow_py.training.config.config import load_config
from rustyflow_py.training.evaluation import evaluate
from rustyflow_py.training.outputs.checkpoint import Checkpoint
from rustyflow_py.training.run.loop import Trainer

pytestmark = pytest.mark.usefixtures("tiny_dir")


# ------------------------------------------------------------------------------ learning


def test_tiny_model_memorises_the_corpus() -> None:
    cfg = make_cfg(NUM_EPOCHS=2)
    trainer = Trainer(cfg, quiet)
    record = trainer.run()

    losses = trainer.losses
    vocab = len(trainer.parts.corpus.vocab)
    assert len(losses) == record["steps"] == 2 * STEPS_PER_EPOCH
    assert losses[0] == pytest.approx(math.log(vocab), abs=0.2)  # uniform guess at init
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert record["status"] == "completed" and record["epochs"] == 2
    assert record["final_loss"] == losses[-1]
    assert record["val_ppl"] < 0.5 * vocab
    assert log_records()[-1]["final_loss"] == losses[-1]


# ------------------------------------------------------------------------------ resume


def weights_and_state(path: str) -> dict[str, np.ndarray]:
    ckpt = Checkpoint(path)
    return {**{f"param/{k}": v for k, v in ckpt.weights.items()},
            **{f"opt/{k}": v for k, v in ckpt.optimizer.items()}}


@pytest.mark.parametrize(
    ("epochs", "stops"),
    [
        pytest.param(1, [7], id="mid-epoch"),
        pytest.param(2, [10, 40], id="in-epoch-1-and-in-epoch-2"),
        pytest.param(2, [STEPS_PER_EPOCH], id="on-the-epoch-boundary"),
    ],
)
def test_resume_continues_exactly(epochs: int, stops: list[int]) -> None:
    """Interrupted and resumed (possibly several times) == uninterrupted, bit for bit."""
    straight = Trainer(make_cfg(NUM_EPOCHS=epochs, MODEL_PATH="models/a.npz"), quiet)
    expected = straight.run()

    cfg = make_cfg(NUM_EPOCHS=epochs, MODEL_PATH="models/b.npz")
    resume = None
    for stop in stops:
        trainer = run_interrupted(cfg, stop, resume)
        assert len(trainer.losses) == stop
        assert trainer.losses == straight.losses[:stop]
        resume = trainer.checkpoint_path
    resumed = Trainer(cfg, quiet, resume=resume)
    record = resumed.run()

    assert resumed.losses == straight.losses  # every step's loss, before and after each resume
    assert len(resumed.losses) == epochs * STEPS_PER_EPOCH
    a, b = weights_and_state("models/a-cpu.npz"), weights_and_state("models/b-cpu.npz")
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a), [k for k in a
                                                         if not np.array_equal(a[k], b[k])]
    assert (record["val_ppl"], record["test_ppl"]) == (expected["val_ppl"], expected["test_ppl"])
    assert record["epochs"] == expected["epochs"] == epochs


def test_resume_with_dropout_continues_exactly() -> None:
    """The dropout masks of the steps after a resume are the ones the straight run drew."""
    straight = Trainer(make_cfg(DROPOUT=0.1, MODEL_PATH="models/a.npz"), quiet)
    straight.run()
    cfg = make_cfg(DROPOUT=0.1, MODEL_PATH="models/b.npz")
    first = run_interrupted(cfg, 7)
    resumed = Trainer(cfg, quiet, resume=first.checkpoint_path)
    resumed.run()
    assert resumed.losses == straight.losses


def test_random_offsets_move_the_windows_and_resume_exactly() -> None:
    """RANDOM_OFFSETS=true: one window an epoch fewer, other batches than without it, and a
    run resumed mid-epoch-2 reads the windows the straight run read (the same losses)."""
    fixed = Trainer(make_cfg(NUM_EPOCHS=2, MODEL_PATH="models/f.npz"), quiet)
    fixed.run()
    straight = Trainer(make_cfg(NUM_EPOCHS=2, RANDOM_OFFSETS=True, MODEL_PATH="models/a.npz"),
                       quiet)
    straight.run()
    assert straight.parts.steps_per_epoch == fixed.parts.steps_per_epoch - 1
    assert len(straight.losses) == 2 * straight.parts.steps_per_epoch
    assert all(map(math.isfinite, straight.losses))
    assert straight.losses[0] != fixed.losses[0]  # the same weights on another window
    cfg = make_cfg(NUM_EPOCHS=2, RANDOM_OFFSETS=True, MODEL_PATH="models/b.npz")
    first = run_interrupted(cfg, straight.parts.steps_per_epoch + 3)
    resumed = Trainer(cfg, quiet, resume=first.checkpoint_path)
    resumed.run()
    assert resumed.losses == straight.losses


def test_resume_refuses_a_checkpoint_of_another_shape() -> None:
    first = run_interrupted(make_cfg(), 3)
    with pytest.raises(TrainingError, match=r"EMBED_DIM=32 \(checkpoint\) vs 64"):
        Trainer(make_cfg(EMBED_DIM=64), quiet, resume=first.checkpoint_path)


# ------------------------------------------------------------------------------ interruption


def test_interrupted_run_leaves_a_checkpoint_and_a_log_block() -> None:
    messages: list[str] = []
    trainer = run_interrupted(make_cfg(PROFILE=True), 6, say=messages.append)

    path = trainer.checkpoint_path
    assert path == "models/tiny-cpu.npz"
    model, ckpt, cfg = evaluate.load_model(path, "cpu")
    assert ckpt.meta["train"]["step"] == 6 and ckpt.meta["train"]["losses"] == trainer.losses
    assert (cfg.embed_dim, cfg.num_layers) == (32, 1)
    for name, weight in trainer.model.buffer.state_dict().items():
        assert np.array_equal(model.buffer.params[name].data, weight)

    [record] = log_records()
    assert record["status"] == "interrupted" and record["steps"] == 6
    assert "step 6" in record["message"] and record["checkpoint"] == path
    assert record["profile"]["profiled_steps"] == 6
    text = Path("log.txt").read_text()
    assert text.count(BLOCK_START) == 1 and text.rstrip().endswith(BLOCK_END)
    assert f"{BLOCK_START}{record['timestamp']} | interrupted |" in text
    assert any("Interrupted at step 6" in m for m in messages)


def test_ctrl_c_then_resume_from_the_command_line(tiny_dir: Path) -> None:
    """A real SIGINT to `rustyflow train`: exit 130, a checkpoint, an interrupted block; then
    `train --resume` picks up from it. (Where in a step the signal lands is up to the OS, so
    the exactness of what follows is left to the deterministic tests.)"""
    assert signal_the_command(tiny_dir, signal.SIGINT) == 130
    [record] = log_records()
    assert record["status"] == "interrupted" and record["steps"] >= STEPS_PER_EPOCH
    stopped = Checkpoint("models/tiny-cpu.npz").meta["train"]["step"]
    assert stopped == record["steps"]

    target = stopped + 5
    result = invoke("train", "--config", "tiny.env", "--resume", "models/tiny-cpu.npz",
                    "--max-steps", str(target))
    assert result.exit_code == 0, result.output
    assert f"Resumed from models/tiny-cpu.npz at step {stopped}" in result.output
    resumed = Checkpoint("models/tiny-cpu.npz").meta["train"]["losses"]
    assert len(resumed) == target and all(map(math.isfinite, resumed))

    straight = Trainer(make_cfg(NUM_EPOCHS=1000, MAX_STEPS=stopped, MODEL_PATH="models/a.npz"),
                       quiet)
    straight.run()
    assert resumed[:stopped] == straight.losses  # the steps before Ctrl-C, as logged


def test_ctrl_c_inside_the_optimizer_update_still_resumes_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    straight = Trainer(make_cfg(MODEL_PATH="models/a.npz"), quiet)
    straight.run()

    real_update = AdamW._update
    calls = 0

    def update(self: AdamW, scale: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 7:  # SIGINT after the step counter moved, before the update: deferred
            os.kill(os.getpid(), signal.SIGINT)
        real_update(self, scale)

    monkeypatch.setattr(AdamW, "_update", update)
    cfg = make_cfg(MODEL_PATH="models/b.npz")
    first = Trainer(cfg, quiet)
    with pytest.raises(KeyboardInterrupt):
        first.run()
    monkeypatch.setattr(AdamW, "_update", real_update)
    resumed = Trainer(cfg, quiet, resume=first.checkpoint_path)
    resumed.run()
    assert resumed.losses == straight.losses


# ------------------------------------------------------------------------------ divergence


def test_non_finite_loss_names_the_exact_step(monkeypatch: pytest.MonkeyPatch) -> None:
    poison_weights_after(monkeypatch, 5)  # loss 6 is NaN; it is read back with losses 5-8
    trainer = Trainer(make_cfg(), quiet)
    with pytest.raises(TrainingError, match=r"loss is nan at step 6: training diverged"):
        trainer.run()
    assert len(trainer.losses) == 5 and all(map(math.isfinite, trainer.losses))
    [record] = log_records()
    assert record["status"] == "failed" and record["steps"] == 5
    assert "loss is nan at step 6" in record["message"]
    assert not Path("models/tiny-cpu.npz").exists()  # NaN weights are never saved


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
def test_absurd_learning_rate_fails_the_cli_run_naming_the_step() -> None:
    result = invoke("train", "--config", "tiny.env", "--learning-rate", "1e6",
                    "--grad-clip", "0", "--log-interval", "10")
    assert result.exit_code == 1
    match = re.search(r"^Error: loss is (nan|inf|-inf) at step (\d+): training diverged",
                      result.output, re.MULTILINE)
    assert match, result.output
    [record] = log_records()
    assert record["status"] == "failed" and record["steps"] == int(match[2]) - 1
    assert f"at step {match[2]}" in record["message"]


# ------------------------------------------------------------------------------ the log


def test_two_processes_appending_at_once_leave_two_intact_blocks(tiny_dir: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "rustyflow_py", "train", "--config", "tiny.env",
             "--max-steps", "6", "--profile", "--model-path", f"models/{name}.npz"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=subprocess_env())
        for name in ("first", "second")
    ]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs

    text = (tiny_dir / "log.txt").read_text()
    assert text.count(BLOCK_START) == text.count(BLOCK_END) == 2
    records = log_records()
    assert sorted(r["checkpoint"] for r in records) == ["models/first.npz",  # as typed
                                                        "models/second.npz"]
    assert all(r["status"] == "completed" and r["steps"] == 6 for r in records)
    assert all(r["profile"]["ops"] for r in records)


def test_report_reads_what_train_wrote() -> None:
    assert invoke("train", "--config", "tiny.env", "--max-steps", "8", "--profile").exit_code == 0
    assert invoke("train", "--config", "tiny.env", "--max-steps", "4",
                  "--model-path", "models/other.npz").exit_code == 0
    first, second = log_records()

    table = invoke("report", "--log", "log.txt")
    assert table.exit_code == 0, table.output
    assert "Runs (2)" in table.output and first["timestamp"] in table.output
    assert "L1 H2 E32 T16 B4" in table.output
    # The latest run with a profile is the first one (the second ran with PROFILE=false).
    assert "Total matmul time (CPU + GPU)" in table.output
    assert "[AVG_EPOCH_TIME]" in table.output and "[RUN_JSON]" not in table.output

    md = invoke("report", "--log", "log.txt", "--format", "markdown", "--last", "1")
    assert md.exit_code == 0
    assert "## Runs (1)" in md.output and "| Timestamp | Status |" in md.output

    doc = invoke("report", "--log", "log.txt", "--format", "json")
    assert doc.exit_code == 0
    parsed = json.loads(doc.output)
    assert parsed["runs"] == [first, second]
    assert parsed["latest"]["checkpoint"] == "models/tiny-cpu.npz"
    assert second["profile"] is None and first["profile"]["ops"]


# ------------------------------------------------------------------------------ config errors


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed")
def test_cpu_kernels_that_fail_to_compile_fall_back_to_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rustyflow_py.engine.ops import cpu_jit as jit

    def cannot_compile() -> None:
        raise RuntimeError("no LLVM target for this CPU")

    monkeypatch.setattr(jit, "warm_up", cannot_compile)
    said: list[str] = []
    trainer = Trainer(make_cfg(MAX_STEPS=2), said.append)
    assert trainer.backend.kernels.jit is None and trainer.backend.policy.cpu_jit == "off"
    assert get_backend("cpu").kernels.jit is jit  # the shared device is untouched
    assert any("training with the NumPy kernels" in line for line in said)
    assert trainer.run()["status"] == "completed"
    with pytest.raises(TrainingError, match=r"CPU_JIT=on, but numba could not compile.*"
                                            r"no LLVM target"):
        Trainer(make_cfg(CPU_JIT="on"), quiet, overwrite=True)


@pytest.mark.parametrize(
    ("config", "args", "expected"),
    [
        ({"BATCH_SIZE": "abc"}, [], "tiny.env: BATCH_SIZE='abc' is not valid: expected a "
                                    "positive integer"),
        ({}, ["--batch-size", "-1"], "command line --batch-size: BATCH_SIZE='-1' is not valid"),
        ({"EMBED_DIM": 33}, [], "EMBED_DIM=33 (tiny.env) is not divisible by NUM_HEADS=2"),
        ({}, ["--dropout", "1.5"], "command line --dropout: DROPOUT='1.5' is not valid: "
                                   "expected a finite number in [0, 1)"),
        ({"DATASET": "missing.txt"}, [], "tiny.env: DATASET='missing.txt' is not valid"),
        ({"MODEL_PATH": "models/x.pt"}, [], "tiny.env: MODEL_PATH='models/x.pt' is not valid: "
                                            "expected a path ending in .npz"),
    ],
)
def test_bad_config_is_a_clean_error_before_any_work(
    tiny_dir: Path, config: dict[str, Any], args: list[str], expected: str
) -> None:
    (tiny_dir / "tiny.env").write_text(env_file({**TINY, **config}))
    result = invoke("train", "--config", "tiny.env", *args)
    assert result.exit_code == 1
    assert f"Error: {expected}" in result.output
    assert "Traceback" not in result.output
    assert not (tiny_dir / "log.txt").exists() and not (tiny_dir / "models").exists()


# ------------------------------------------------------------------------------ devices


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> str:
    """Why the GPU is unusable here; on a machine with a GPU, it is switched off for the test."""
    if gpu_unavailable_reason() is None:
        monkeypatch.setenv("RUSTYFLOW_DISABLE_GPU", "1")
    reason = gpu_unavailable_reason()
    assert reason is not None
    return reason


def test_gpu_request_without_a_gpu_falls_back_to_the_cpu(no_gpu: str) -> None:
    result = invoke("train", "--config", "tiny.env", "--device", "gpu", "--max-steps", "3")
    assert result.exit_code == 0, result.output
    assert f"WARN: GPU requested but not usable, falling back to CPU ({no_gpu})" in (
        result.output.splitlines())
    [record] = log_records()
    assert (record["device"], record["device_requested"]) == ("cpu", "gpu")
    assert record["fallback_reason"] == no_gpu
    assert record["checkpoint"] == "models/tiny-cpu.npz"
    assert f"device=cpu (requested gpu, fell back: {no_gpu})" in Path("log.txt").read_text()


def test_strict_device_makes_the_missing_gpu_an_error(no_gpu: str) -> None:
    result = invoke("train", "--config", "tiny.env", "--device", "gpu", "--strict-device")
    assert result.exit_code == 1
    assert f"Error: --device gpu: {no_gpu} (STRICT_DEVICE=true" in result.output
    assert not Path("log.txt").exists()


# ------------------------------------------------------------------------------ shell wrappers


def test_banner_shows_what_train_would_run() -> None:
    result = invoke("banner", "--config", "tiny.env", "--device", "auto", "--num-layers", "3",
                    "--strict-device", "--resume", "tiny.txt")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "RustyFlow train",
        "  config      tiny.env",
        "  dataset     tiny.txt",
        f"  found in    {Path('tiny.txt').absolute()}",
        "  device      auto (strict: no CPU fallback)",
        "  model       L3 H2 E32, dropout 0, fp32",
        "  model path  tiny.txt",  # a resumed run writes the file it resumes
        "  epochs      1",
        "  batch       4",
        "  seq len     16",
        "  LR          0.01 (adamw, 5 warm-up steps, cosine to 0.1x)",
        "  optimizer   adamw (BETA1=0.9, BETA2=0.95, ADAM_EPS=1e-08, WEIGHT_DECAY=0.1)",
        "  log         log.txt",
        "  resume      tiny.txt",
    ]
    bare = invoke("banner")
    assert bare.exit_code == 0
    assert "  config      none (built-in defaults, environment and flags)" in bare.output
    assert "  dataset     wikitext-2" in bare.output


def run_script(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A train script with no TTY, using this interpreter (RUSTYFLOW_PYTHON skips .venv)."""
    return subprocess.run(
        ["bash", str(REPO / script), *args], stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=120, env=subprocess_env(RUSTYFLOW_PYTHON=sys.executable, **env))


def absolute_config(tiny_dir: Path, **changes: Any) -> None:
    """tiny.env with absolute paths (the scripts run in the caller's folder, so relative ones
    would do as well)."""
    values = {**TINY, "DATASET": tiny_dir / "tiny.txt", "LOG_FILE": tiny_dir / "log.txt",
              "MODEL_PATH": tiny_dir / "models" / "tiny.npz", **changes}
    (tiny_dir / "tiny.env").write_text(env_file(values))


@pytest.mark.parametrize(("script", "device"), [("train_cpu.sh", "cpu"),
                                                ("train_gpu.sh", "gpu")])
def test_train_script_prints_the_banner_and_trains(
    tiny_dir: Path, script: str, device: str, no_gpu: str
) -> None:
    absolute_config(tiny_dir)
    done = run_script(script, "tiny.env", "--max-steps", "5", "--seq-len", "8")
    assert done.returncode == 0, done.stdout + done.stderr
    banner = done.stdout.split("\n")
    ckpt = tiny_dir / "models" / "tiny-cpu.npz"
    assert banner[0] == "RustyFlow train"
    for line in ("  config      tiny.env", f"  dataset     {tiny_dir / 'tiny.txt'}",
                 f"  device      {device}", "  epochs      1 (stop after 5 steps)",
                 "  batch       4", "  seq len     8"):
        assert line in banner
    assert any(line.startswith("  LR          0.01 (adamw") for line in banner)
    assert any(line.startswith("  model path") and str(ckpt) in line for line in banner)
    if device == "gpu":  # a warning: on stderr, like every warning
        assert f"WARN: GPU requested but not usable, falling back to CPU ({no_gpu})" in (
            done.stderr.splitlines())
        assert "WARN" not in done.stdout
    [record] = log_records(tiny_dir / "log.txt")
    assert record["status"] == "completed" and record["steps"] == 5
    assert record["model"]["seq_len"] == 8 and record["device_requested"] == device
    assert ckpt.is_file()


@pytest.mark.parametrize("script", ["train_cpu.sh", "train_gpu.sh"])
@pytest.mark.parametrize(
    ("change", "message"),
    [({"BATCH_SIZE": "abc"}, "BATCH_SIZE='abc' is not valid"),
     ({"LEARNING_RATE": 1e6, "GRAD_CLIP": 0}, "training diverged")],
    ids=["bad-config", "diverged"],
)
def test_train_script_passes_a_failure_through(
    tiny_dir: Path, script: str, change: dict[str, Any], message: str, no_gpu: str
) -> None:
    absolute_config(tiny_dir, **change)
    done = run_script(script, str(tiny_dir / "tiny.env"))
    assert done.returncode == 1
    assert message in done.stderr


def test_train_script_without_config_reads_the_config_env_of_its_folder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No CONFIG: options still pass through, on top of ./config.env (here the repository's)."""
    monkeypatch.chdir(REPO)
    done = run_script("train_cpu.sh", "--num-heads", "3")
    assert done.returncode == 1
    assert ("EMBED_DIM=128 (config.env) is not divisible by NUM_HEADS=3 "
            "(command line --num-heads)") in done.stderr


# ------------------------------------------------------------------------------ real data


def truncating_splits(windows: int) -> Callable[..., data.Corpus]:
    """load_corpus, keeping only the first `windows` evaluation windows of valid and test."""
    real = data.load_corpus

    def load(*args: Any, **kwargs: Any) -> data.Corpus:
        corpus = real(*args, **kwargs)
        keep = windows * 16 * 65  # BATCH_SIZE x (SEQ_LEN + 1) of the seed shape
        corpus.valid, corpus.test = corpus.valid[:keep], corpus.test[:keep]
        return corpus

    return load


@pytest.mark.skipif(real_data_dir() is None, reason="real WikiText-2 not found: set "
                    "RUSTYFLOW_DATA_DIR to a folder holding wikitext-2/ (or ../shared/data)")
def test_real_wikitext2_seed_shape_steps_and_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three steps of the seed shape on WikiText-2, then the report in console and log.

    Evaluating the full valid and test splits takes minutes on two cores, so load_corpus is
    wrapped to keep two windows of each: the evaluation code still runs, on less text.
    """
    monkeypatch.setattr(data, "load_corpus", truncating_splits(2))
    data_dir = real_data_dir()
    assert data_dir is not None
    cfg, _ = load_config(None, {"DATA_DIR": str(data_dir.resolve()), "MAX_STEPS": 3,
                                "LOG_INTERVAL": 1, "PROFILE": True, "DEVICE": "cpu",
                                "LOG_FILE": "log.txt"}, environ={})
    messages: list[str] = []
    trainer = Trainer(cfg, messages.append)
    record = trainer.run()

    assert len(trainer.parts.corpus.vocab) == 33278
    assert trainer.losses[0] == pytest.approx(math.log(33278), abs=0.1)
    assert record["model"] == {"layers": 2, "heads": 4, "embed": 128, "seq_len": 64,
                               "batch": 16, "vocab": 33278, "params": record["model"]["params"]}
    assert record["steps"] == 3 and record["status"] == "completed"
    assert record["checkpoint"] == "models/wikitext-2-L2-H4-E128-cpu.npz"
    assert "matmul" in {op["category"] for op in record["profile"]["ops"]}
    console = "\n".join(messages)
    text = Path("log.txt").read_text()
    for needle in ("Per-op profile (wall): per-op wall times of every step; 3 of 3 steps profiled",
                   "Total matmul time (CPU + GPU):", "Amdahl's bound:", "Phase split",
                   "Host<->device traffic per step:", "[AVG_EPOCH_TIME] ", "[RUN_JSON] "):
        assert needle in text
    # the console gets a concise summary; the full block is in the log
    for needle in ("=== RustyFlow run ", "Top 5 ops of ", "Total matmul time (CPU + GPU):",
                   "Amdahl's bound:", "Checkpoint: models/wikitext-2-L2-H4-E128-cpu.npz",
                   "Full report: appended to log.txt"):
        assert needle in console
    for needle in ("[RUN_JSON]", "Phase split", "Host<->device traffic"):
        assert needle not in console
