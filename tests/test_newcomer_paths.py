"""Paths as a newcomer types them: a --model-path is used as typed and --resume finds it again;
a resumed run writes the file it resumed; a GPU config that falls back to the CPU repeats the
CPU run of the same config (and says why when it cannot); and every command and script works
in the folder it is started from, naming paths as they were given.

Each case is the command as typed (CliRunner, or a subprocess for the scripts), its exit status
and its exact message line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, invoke, log_records, one_error, subprocess_env

from rustyflow_py.training.config.config import load_config

pytestmark = pytest.mark.usefixtures("tiny_dir")

SHORT = ("--max-steps", "2")


# ------------------------------------------------------------------ the checkpoint path rule


@pytest.mark.parametrize(("given", "environ", "resume", "cpu", "gpu"), [
    ({"MODEL_PATH": "runs/r.npz"}, {}, None, "runs/r.npz", "runs/r.npz"),
    ({"MODEL_PATH": "runs/r.npz"}, {}, "old.npz", "runs/r.npz", "runs/r.npz"),
    ({}, {"MODEL_PATH": "runs/r.npz"}, None, "runs/r-cpu.npz", "runs/r-gpu.npz"),
    ({}, {"MODEL_PATH": "runs/r.npz"}, "old.npz", "old.npz", "old.npz"),
    ({}, {}, None, "models/wikitext-2-L2-H4-E128-cpu.npz", "models/wikitext-2-L2-H4-E128-gpu.npz"),
], ids=["typed", "typed-beats-resume", "configured", "resume", "default"])
def test_one_rule_for_the_checkpoint_path(given: dict[str, str], environ: dict[str, str],
                                          resume: str | None, cpu: str, gpu: str) -> None:
    cfg, _ = load_config(None, given, environ)
    assert (cfg.model_path_for("cpu", resume), cfg.model_path_for("gpu:1", resume)) == (cpu, gpu)


def test_a_typed_model_path_is_written_and_resumed_as_typed() -> None:
    first = invoke("train", "tiny.env", "--model-path", "runs/r.npz", *SHORT)
    assert first.exit_code == 0, first.output
    assert "Checkpoint: runs/r.npz" in first.stdout.splitlines()
    assert sorted(p.name for p in Path("runs").glob("*.npz")) == ["r-best.npz", "r.npz"]
    again = invoke("train", "tiny.env", "--resume", "runs/r.npz", "--max-steps", "4")
    assert again.exit_code == 0, again.output
    assert "Resumed from runs/r.npz at step 2 (epoch 1, batch 2)" in again.stdout.splitlines()
    assert [r["checkpoint"] for r in log_records()] == ["runs/r.npz", "runs/r.npz"]
    assert sorted(p.name for p in Path("runs").glob("*.npz")) == ["r-best.npz", "r.npz"]


def test_a_resume_without_the_device_suffix_names_the_file_that_has_it(tiny_dir: Path) -> None:
    assert invoke("train", "tiny.env", *SHORT).exit_code == 0
    result = invoke("train", "tiny.env", "--resume", "models/tiny.npz")
    assert one_error(result) == (
        f"Error: --resume models/tiny.npz: no such file ({tiny_dir}/models/tiny.npz); "
        f"models/tiny-cpu.npz exists (train adds -cpu or -gpu to a MODEL_PATH from the config): "
        f"pass --resume models/tiny-cpu.npz")
    nothing = invoke("train", "tiny.env", "--resume", "/nowhere/r.npz")
    assert one_error(nothing) == (
        "Error: --resume /nowhere/r.npz: no such file: pass the checkpoint a run wrote (its "
        "`Checkpoint:` line)")


# ------------------------------------------------------------------ a GPU config on the CPU


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUSTYFLOW_DISABLE_GPU", "1")


FALLBACK = "WARN: GPU requested but not usable, falling back to CPU (RUSTYFLOW_DISABLE_GPU is set)"


@pytest.mark.usefixtures("no_gpu")
@pytest.mark.parametrize(("first", "then"), [("cpu", "gpu"), ("gpu", "cpu"), ("auto", "gpu")])
def test_a_fallback_run_repeats_the_cpu_run_of_the_same_config(first: str, then: str) -> None:
    assert invoke("train", "tiny.env", "--device", first, *SHORT).exit_code == 0
    result = invoke("train", "tiny.env", "--device", then, *SHORT)
    assert result.exit_code == 0, result.output
    assert ("INFO: replaced the checkpoint models/tiny-cpu.npz of an earlier run of the same "
            "configuration (trained 2 steps)") in result.output.splitlines()
    assert [r["checkpoint"] for r in log_records()] == ["models/tiny-cpu.npz"] * 2


@pytest.mark.usefixtures("no_gpu")
def test_a_fallback_onto_another_runs_checkpoint_says_the_fallback_is_why() -> None:
    assert invoke("train", "tiny.env", "--device", "cpu", "--max-steps", "3").exit_code == 0
    result = invoke("train", "tiny.env", "--device", "gpu", *SHORT)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        FALLBACK,
        "Error: checkpoint models/tiny-cpu.npz holds another run's model (trained 3 steps), "
        "which this run would replace: the GPU is not usable (RUSTYFLOW_DISABLE_GPU is set), "
        "so this run fell back to the CPU and writes the CPU run's checkpoint; resume it with "
        "--resume models/tiny-cpu.npz, set --model-path to a new file, pass --overwrite to "
        "replace it, or --strict-device to stop instead of falling back"]


# ------------------------------------------------------------------ the working directory


def script(name: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """A script of the checkout, run from the test's folder (outside the checkout) with this
    interpreter, as `/path/to/rustyflow/NAME ARGS...`."""
    return subprocess.run(["bash", str(REPO / name), *args], input=stdin, capture_output=True,
                          text=True, timeout=120,
                          env=subprocess_env(RUSTYFLOW_PYTHON=sys.executable,
                                             PYTHON=sys.executable))


def test_scripts_and_commands_from_another_folder_use_that_folder(tiny_dir: Path) -> None:
    """train_cpu.sh, report and chat_cpu.sh from outside the checkout: the relative config,
    data, log and checkpoint are all this folder's."""
    done = script("train_cpu.sh", *SHORT, "tiny.env")
    assert done.returncode == 0, done.stderr
    assert "  config      tiny.env" in done.stdout.splitlines()
    assert sorted(p.name for p in (tiny_dir / "models").iterdir()) == [
        "tiny-cpu-best.npz", "tiny-cpu.npz"]
    [record] = log_records(tiny_dir / "log.txt")
    assert record["steps"] == 2
    report = script("rustyflow", "report", "--log", "log.txt")
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith("Runs (1")
    chat = script("chat_cpu.sh", "tiny.env", "--max-tokens", "2", stdin="the cat\nquit\n")
    assert chat.returncode == 0, chat.stderr
    assert "models/tiny-cpu" in chat.stderr


def test_script_options_and_config_in_any_order_and_their_errors() -> None:
    bad = script("train_cpu.sh", "--batch-size", "0", "tiny.env")
    assert one_error(bad) == (
        "Error: command line --batch-size: BATCH_SIZE='0' is not valid: expected a positive "
        "integer")
    missing = script("train_cpu.sh", "tiny")
    assert missing.returncode == 1
    [line] = missing.stderr.splitlines()
    assert line.startswith(f"Error: tiny: config file not found (looked for {Path.cwd()}/tiny); "
                           "did you mean tiny.env? (./ holds tiny.env; ")


def test_hints_name_the_wrapper_as_the_user_ran_it(tiny_dir: Path) -> None:
    """`/path/to/rustyflow report` from another folder: the hint's command is that path,
    which works from here (not `./rustyflow`, nor `python -m rustyflow_py`, which does not
    import outside the checkout's .venv)."""
    result = script("rustyflow", "report")
    assert one_error(result) == (
        f"Error: training_log.txt not found (looked for {tiny_dir}/training_log.txt): no run "
        f"has logged in this folder; run `{REPO}/rustyflow train` here first, or pass --log "
        f"FILE")


def test_report_names_the_log_as_given(tiny_dir: Path) -> None:
    default = invoke("report")
    assert one_error(default) == (
        f"Error: training_log.txt not found (looked for {tiny_dir}/training_log.txt): no run "
        f"has logged in this folder; run `python -m rustyflow_py train` here first, or pass "
        f"--log FILE")
    given = invoke("report", "--log", "nosuch.txt")
    assert one_error(given) == (
        f"Error: nosuch.txt not found (looked for {tiny_dir}/nosuch.txt): pass --log the "
        f"LOG_FILE a run wrote (relative paths are read from the folder you are in)")


def test_data_info_names_a_relative_data_dir_with_its_absolute_path(tiny_dir: Path) -> None:
    result = invoke("data", "info", "--data-dir", "nosuch")
    assert one_error(result) == (
        f"Error: DATA_DIR=nosuch ({tiny_dir}/nosuch) does not exist or is not a folder: fix the "
        f"path (--data-dir or DATA_DIR), or leave it empty to look in $RUSTYFLOW_DATA_DIR, "
        f"./data and ../shared/data")

