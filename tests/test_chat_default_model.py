"""`chat` and `generate` without --model take the model of the latest completed run in the
log (its best checkpoint first), and say which; the chat scripts take CONFIG and options in
any order. The folder is a newcomer's after the quick try: config.env (whose MODEL_PATH was
never trained), quick.env (its own MODEL_PATH), training_log.txt, and copies of the chat
scripts, as in a clone (they run in the folder the user is in, as every command does)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, TINY, env_file, invoke, make_cfg, run_interrupted, subprocess_env

from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.training.config.config import load_config

BASE = {k: v for k, v in TINY.items() if k not in ("LOG_FILE", "MODEL_PATH")}
CHAT = "the cat\nquit\n"


@pytest.fixture
def tried(tiny_dir: Path) -> Path:
    """The quick try done: models/quick-cpu.npz, its best file, one completed run logged."""
    (tiny_dir / "config.env").write_text(env_file(BASE))
    (tiny_dir / "quick.env").write_text(env_file({**BASE, "MODEL_PATH": "models/quick.npz"}))
    train("quick.env")
    for script in ("chat_cpu.sh", "chat_gpu.sh"):
        shutil.copy(REPO / script, tiny_dir / script)
    return tiny_dir


def train(config: str) -> None:
    result = invoke("train", "--config", config, "--max-steps", "3")
    assert result.exit_code == 0, result.output


def stamp(run: int = -1) -> str:
    """The timestamp of a run of training_log.txt (the last by default)."""
    return read_log("training_log.txt")[run]["timestamp"]


def chosen(path: str, run: int = -1, kind: str = "best", whose: str = "the") -> str:
    """The line that names the model taken from run `run` of the log."""
    return (f"Model: {path} (the {kind} checkpoint of {whose} latest completed run in "
            f"training_log.txt, {stamp(run)}; --model picks another)")


def chat_script(*args: str, cwd: Path | None = None,
                script: str = "chat_cpu.sh") -> subprocess.CompletedProcess[str]:
    """A chat script of the folder, as typed there (or in `cwd`), with this interpreter."""
    folder = Path.cwd()
    return subprocess.run([str(folder / script), *args], input=CHAT, capture_output=True,
                          text=True, timeout=120, cwd=cwd or folder,
                          env=subprocess_env(PYTHON=sys.executable, RUSTYFLOW_DISABLE_GPU="1"))


def generate(*args: str) -> tuple[int, str]:
    """`generate` of two tokens on the CPU: (exit code, the first line on stderr)."""
    result = invoke("generate", "--prompt", "the", "--max-tokens", "2", "--device", "cpu", *args)
    return result.exit_code, result.stderr.partition("\n")[0]


@pytest.mark.parametrize("script", ["chat_cpu.sh", "chat_gpu.sh"])
def test_chat_right_after_the_quick_try_takes_its_best_model(tried: Path, script: str) -> None:
    result = chat_script(script=script)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(chosen("models/quick-cpu-best.npz")), result.stderr
    assert "Chatting with models/quick-cpu-best.npz on cpu" in result.stderr
    assert result.stdout.count("> ") == 2


@pytest.mark.parametrize(("args", "model"), [
    (("--model", "models/quick-cpu.npz"), "models/quick-cpu.npz"),
    (("--temperature", "0", "--model=models/quick-cpu.npz"), "models/quick-cpu.npz"),
    (("--max-tokens", "2", "quick.env"), "models/quick-cpu-best.npz"),
    (("quick.env", "--max-tokens", "2", "--quiet"), None),
], ids=["model", "model-after-an-option", "config-last", "config-first"])
def test_the_chat_script_takes_options_and_config_in_any_order(
        tried: Path, args: tuple[str, ...], model: str | None) -> None:
    result = chat_script(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("> ") == 2
    if model is None:  # --quiet: nothing on stderr
        assert result.stderr == ""
    elif "quick.env" in args:  # a named config: the latest of its own runs
        assert result.stderr.startswith(chosen(model, whose="this config's")), result.stderr
    else:
        assert result.stderr.startswith(f"Chatting with {model} on cpu"), result.stderr


def test_the_chat_script_takes_a_model_path_as_typed_in_another_folder(tried: Path) -> None:
    (tried / "sub").mkdir()
    result = chat_script("--model", "../models/quick-cpu.npz", cwd=tried / "sub")
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("Chatting with ../models/quick-cpu.npz on cpu")


def test_the_chat_script_refuses_two_configs(tried: Path) -> None:
    result = chat_script("quick.env", "--config", "config.env")
    assert result.returncode == 1
    assert result.stderr == "Error: two configs given (quick.env and config.env): pass one\n"


def test_the_latest_completed_run_wins_and_one_whose_files_are_gone_is_passed_over(
        tried: Path) -> None:
    (tried / "later.env").write_text(env_file({**BASE, "MODEL_PATH": "models/later.npz"}))
    train("later.env")
    assert generate() == (0, chosen("models/later-cpu-best.npz"))
    for name in ("later-cpu.npz", "later-cpu-best.npz"):
        (tried / "models" / name).unlink()
    assert generate() == (0, chosen("models/quick-cpu-best.npz", run=0))


def test_a_named_config_takes_its_own_latest_run(tried: Path) -> None:
    (tried / "later.env").write_text(env_file({**BASE, "MODEL_PATH": "models/later.npz"}))
    train("later.env")
    code, said = generate("--config", "quick.env")
    assert (code, said) == (0, chosen("models/quick-cpu-best.npz", run=0,
                                      whose="this config's"))


def test_without_a_best_file_the_final_checkpoint_is_taken(tried: Path) -> None:
    (tried / "models" / "quick-cpu-best.npz").unlink()
    assert generate() == (0, chosen("models/quick-cpu.npz", kind="final"))


def test_an_interrupted_run_is_not_taken(tried: Path) -> None:
    """A later run stopped by Ctrl-C wrote a checkpoint, but did not complete."""
    run_interrupted(make_cfg(LOG_FILE="training_log.txt", MODEL_PATH="models/later.npz"), 2)
    later = read_log("training_log.txt")[-1]
    assert later["status"] == "interrupted" and Path(later["checkpoint"]).is_file()
    assert generate() == (0, chosen("models/quick-cpu-best.npz", run=0))


def test_without_a_usable_run_the_config_s_model_path_is_taken(tried: Path) -> None:
    (tried / "training_log.txt").unlink()
    code, said = generate("--config", "quick.env")
    assert (code, said) == (0, "Model: models/quick-cpu.npz (MODEL_PATH of the config; "
                               "training_log.txt has no completed run whose checkpoint is "
                               "still there)")


def test_with_nothing_to_take_the_error_lists_what_to_pass(tried: Path) -> None:
    (tried / "training_log.txt").unlink()
    for name in ("quick-cpu.npz", "quick-cpu-best.npz"):
        (tried / "models" / name).rename(tried / "models" / f"old-{name}")
    cfg, _ = load_config("config.env")
    cpu, gpu = cfg.model_path_for("cpu"), cfg.model_path_for("gpu")
    result = chat_script()
    assert result.returncode == 1
    assert result.stderr == (
        f"Error: no --model given, training_log.txt has no completed run whose checkpoint is "
        f"still there, and there is no checkpoint at {cpu} or {gpu} (MODEL_PATH of the "
        f"config): pass one with --model (models/old-quick-cpu-best.npz, "
        f"models/old-quick-cpu.npz), or train one with ./train_cpu.sh or ./train_gpu.sh\n")
