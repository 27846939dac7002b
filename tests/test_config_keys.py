"""Config files as a newcomer writes and names them: an unknown key is an error with its line
and did-you-mean (train and banner alike; --allow-unknown-keys makes it a warning), the config
is a positional CONFIG anywhere among the options, a missing one offers the nearest names and
configs/, and a data folder that was named must exist.

Each case is the command as typed, its exit status and its exact message line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import Result
from helpers import TINY, env_file, invoke, log_records, one_error

pytestmark = pytest.mark.usefixtures("tiny_dir")

SHORT = ("--max-steps", "2")


def config_with(name: str, text: str) -> None:
    """The file `name`: tiny.env's settings (one a line), then `text`."""
    Path(name).write_text(env_file(TINY) + text)


def stderr_line(result: Result, prefix: str) -> str:
    """The one stderr line that starts with `prefix`."""
    [line] = [ln for ln in result.stderr.splitlines() if ln.startswith(prefix)]
    return line


UNKNOWN = (f"Error: typo.env line {len(TINY) + 1}: unknown key 'BATCHSIZE' (did you mean "
           f"BATCH_SIZE?): correct or remove it, or pass --allow-unknown-keys to ignore it")


def test_a_misspelt_key_stops_train_before_any_work() -> None:
    config_with("typo.env", "BATCHSIZE=8\n")
    result = invoke("train", "typo.env", *SHORT)
    assert one_error(result) == UNKNOWN
    assert not Path("log.txt").exists() and not Path("models").exists()


def test_banner_reports_the_same_error() -> None:
    config_with("typo.env", "BATCHSIZE=8\n")
    result = invoke("banner", "typo.env")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [UNKNOWN]


def test_max_step_is_named_with_its_line_in_banner() -> None:
    config_with("steps.env", "MAX_STEP=5\n")
    result = invoke("banner", "--config", "steps.env")
    assert one_error(result) == (
        f"Error: steps.env line {len(TINY) + 1}: unknown key 'MAX_STEP' (did you mean "
        f"MAX_STEPS?): correct or remove it, or pass --allow-unknown-keys to ignore it")


def test_several_unknown_keys_are_named_in_one_line() -> None:
    config_with("typos.env", "BATCHSIZE=8\nWHATEVER=1\n")
    result = invoke("train", "typos.env")
    assert result.exit_code == 1
    line = len(TINY) + 1
    assert result.stderr.splitlines() == [
        f"Error: typos.env: unknown keys 'BATCHSIZE' (line {line}, did you mean BATCH_SIZE?) "
        f"and 'WHATEVER' (line {line + 1}): correct or remove them, or pass "
        f"--allow-unknown-keys to ignore them"]


def test_allow_unknown_keys_warns_once_in_banner_and_in_train() -> None:
    config_with("typo.env", "BATCHSIZE=8\n")
    warning = (f"WARN: typo.env line {len(TINY) + 1}: unknown key 'BATCHSIZE' ignored (did "
               f"you mean BATCH_SIZE?)")
    banner = invoke("banner", "typo.env", "--allow-unknown-keys")
    assert banner.exit_code == 0 and banner.stderr.splitlines() == [warning]
    assert "  batch       4" in banner.stdout.splitlines()  # the key was ignored, not read
    result = invoke("train", "--allow-unknown-keys", "typo.env", *SHORT)
    assert result.exit_code == 0, result.output
    assert stderr_line(result, "WARN: typo.env") == warning
    [record] = log_records()
    assert record["model"]["batch"] == 4


@pytest.mark.parametrize("args", [("tiny.env", *SHORT), (*SHORT, "tiny.env"),
                                  (*SHORT, "tiny.env", "--no-profile")],
                         ids=["config-first", "config-last", "config-between-options"])
def test_the_config_is_a_positional_argument_anywhere(args: tuple[str, ...]) -> None:
    Path("tiny.env").write_text(env_file({**TINY, "LOG_FILE": "positional.txt"}))
    result = invoke("train", *args)
    assert result.exit_code == 0, result.output
    [record] = log_records("positional.txt")
    assert record["steps"] == 2 and record["checkpoint"] == "models/tiny-cpu.npz"


def test_two_configs_are_an_error() -> None:
    result = invoke("train", "tiny.env", "--config", "other.env")
    assert one_error(result) == (
        "Error: two config files: tiny.env and --config other.env: pass one")


def test_a_missing_config_offers_the_nearest_name_and_the_folder(tiny_dir: Path) -> None:
    Path("configs").mkdir()
    for name in ("quick", "seed", "small"):
        (tiny_dir / "configs" / f"{name}.env").write_text("SEQ_LEN=8\n")
    result = invoke("train", "configs/quick")
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(
        f"Error: configs/quick: config file not found (looked for {tiny_dir}/configs/quick); "
        f"did you mean configs/quick.env? (configs/ holds quick.env, seed.env, small.env; ")
    assert line.endswith(": pass a file of KEY=VALUE lines")
    assert "/configs/ holds gpt2-finetune-wikitext2.env," in line  # the checkout's recipes too


def test_an_unset_data_dir_named_in_a_file_stops_train_naming_the_file() -> None:
    config_with("far.env", "DATA_DIR=nowhere\n")
    result = invoke("train", "far.env")
    assert one_error(result) == (
        f"Error: DATA_DIR=nowhere ({Path('nowhere').absolute()}) does not exist or is not a "
        f"folder (set by far.env): fix the path, or leave DATA_DIR empty to look in "
        f"$RUSTYFLOW_DATA_DIR, ./data and ../shared/data")


@pytest.mark.parametrize("command", [("data", "info"), ("banner", "--dataset", "wikitext-2")])
def test_a_missing_rustyflow_data_dir_is_an_error_not_a_fallback(
        command: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUSTYFLOW_DATA_DIR", "/nonexistent")
    result = invoke(*command)
    assert one_error(result) == (
        "Error: RUSTYFLOW_DATA_DIR=/nonexistent does not exist or is not a folder: fix the "
        "path (the environment variable), or unset it to look in ./data and ../shared/data")
