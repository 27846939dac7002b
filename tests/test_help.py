"""`--help` and the names hints give: every option of every command says what it does,
`train --help` lists its options in sections (one per config key, from cli_help), no long
default is cut inside a name, usage lines and hints name the program as the README teaches
(errors.command), and every "install the X extra" hint is a command that works as written
(errors.install_command)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from helpers import subprocess_env

from rustyflow_py import errors
from rustyflow_py.cli import main
from rustyflow_py.cli_help import KEY_SECTIONS, OPTION_SECTIONS, ORDER, wrap
from rustyflow_py.errors import install_command
from rustyflow_py.training.config.config import KEYS

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent  # this interpreter's scripts (pip, rustyflow)


def commands(cmd: click.Command = main,
             path: str = "rustyflow") -> Iterator[tuple[str, click.Command]]:
    """Every command under `main`, with its path (`rustyflow data info`)."""
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from commands(sub, f"{path} {name}")


def test_every_option_of_every_command_has_help() -> None:
    missing = [f"{path} {param.opts[0]}" for path, cmd in commands() for param in cmd.params
               if isinstance(param, click.Option) and not (param.help or "").strip()]
    assert missing == []


def test_every_config_key_has_a_section_and_every_section_is_listed() -> None:
    assert sorted(KEY_SECTIONS) == sorted(KEYS)
    assert set(KEY_SECTIONS.values()) | set(OPTION_SECTIONS.values()) <= set(ORDER)


def help_text(*args: str, width: int = 80) -> list[str]:
    result = CliRunner().invoke(main, [*args, "--help"], terminal_width=width)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_train_help_lists_every_option_under_its_section_in_order() -> None:
    lines = help_text("train")
    titles = [line[:-1] for line in lines if re.fullmatch(r"[A-Z][\w ,()]*:", line)]
    assert titles == [t for t in ORDER if t in titles] + ["Other options"], titles
    assert {"Run", "Model", "Data", "Optimiser", "Precision", "GPU", "Distributed", "Output",
            "Profile"} <= set(titles)
    others = lines[lines.index("Other options:") + 1:]
    assert [line.split()[0] for line in others if line.startswith("  -")] == ["-h,"]
    model = lines[lines.index("Model:") + 1: lines.index("Data:")]
    assert [line.split()[0] for line in model if line.startswith("  --")] == [
        "--seq-len", "--embed-dim", "--num-heads", "--num-layers"]


@pytest.mark.parametrize("width", [80, 100, 60])
def test_no_help_line_is_wider_than_the_terminal_nor_cuts_a_name(width: int) -> None:
    """MODEL_PATH's default once broke as `models/${DATAS` + `ET}-...`: a `${NAME}` now ends
    on the line it starts on, and the default reads whole when its lines are joined (a line
    may end only at a space or after a `-` or `/`)."""
    lines = help_text("train", width=width)
    assert max(map(len, lines)) <= width, max(lines, key=len)
    assert all(line.count("${") == line.count("}") for line in lines)
    joined = re.sub(r"(?<=[-/]) ", "", " ".join(line.strip() for line in lines))
    assert "[default: models/${DATASET}-L${NUM_LAYERS}-H${NUM_HEADS}-E${EMBED_DIM}.npz]" in joined
    assert "[default: ]" not in joined  # an empty default is not shown as one


def test_wrap_breaks_only_a_word_longer_than_the_line() -> None:
    assert wrap("one two-words three", 9) == ["one", "two-words", "three"]
    assert wrap("a models/${X}-L${Y}.npz", 12) == ["a models/", "${X}-", "L${Y}.npz"]
    assert wrap("(-1 = DROPOUT)", 4) == ["(-1", "=", "DROPOUT)"]


def usage(cwd: Path, path: str) -> str:
    """The usage line of `python -m rustyflow_py --help` run in `cwd` with PATH `path`."""
    env = subprocess_env(PATH=path)
    out = subprocess.run([sys.executable, "-m", "rustyflow_py", "--help"], cwd=cwd, env=env,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return out.splitlines()[0]


def test_the_usage_line_names_the_program_as_the_hints_do(tmp_path: Path) -> None:
    """The README's `./rustyflow` in the checkout, plain `rustyflow` once the venv is
    activated (on PATH), `python -m rustyflow_py` elsewhere: never a name that does not run."""
    bare = "/usr/bin:/bin"
    assert usage(REPO, bare) == "Usage: ./rustyflow [OPTIONS] COMMAND [ARGS]..."
    assert usage(tmp_path, bare) == "Usage: python -m rustyflow_py [OPTIONS] COMMAND [ARGS]..."
    if not (VENV_BIN / "rustyflow").is_file():
        pytest.skip("no rustyflow script beside this interpreter (not a venv install)")
    assert usage(tmp_path, f"{VENV_BIN}:{bare}") == "Usage: rustyflow [OPTIONS] COMMAND [ARGS]..."


def test_a_usage_error_of_a_subcommand_names_it_the_same_way() -> None:
    """The train scripts' banner parses train's options: its errors are train's, by name."""
    result = subprocess.run([sys.executable, "-m", "rustyflow_py", "banner", "--no-such"],
                            cwd=REPO, capture_output=True, text=True, timeout=120,
                            env=subprocess_env(PATH="/usr/bin:/bin"))
    assert result.returncode == 2
    assert result.stderr.startswith("Usage: ./rustyflow train [OPTIONS]"), result.stderr
    assert "Try './rustyflow train --help' for help." in result.stderr


def test_the_install_hint_is_this_pythons_pip_on_the_checkout(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In the README's flow (the checkout's .venv, not activated) the hint is that venv's pip
    on the checkout; never a bare `pip`, which would reach the system's Python and be refused
    (externally-managed-environment)."""
    if not (VENV_BIN / "pip").is_file():
        pytest.skip("this interpreter has no pip beside it")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(REPO)
    hint = install_command("plot")
    runner = shlex.split(hint)[0]
    assert (REPO / runner).resolve() == (VENV_BIN / "pip").resolve(), hint
    assert shlex.split(hint)[1:] == ["install", "-e", ".[plot]"]
    monkeypatch.chdir(tmp_path)  # from elsewhere: the same files, by their absolute paths
    assert shlex.split(install_command("plot")) == [
        str(VENV_BIN / "pip"), "install", "-e", f"{REPO}[plot]"]


def test_the_install_hint_in_an_activated_venv_and_for_an_installed_package(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if not (VENV_BIN / "pip").is_file():
        pytest.skip("this interpreter has no pip beside it")
    monkeypatch.setenv("PATH", f"{VENV_BIN}:/usr/bin:/bin")  # `source .venv/bin/activate`
    monkeypatch.chdir(REPO)
    assert install_command("hf") == "pip install -e '.[hf]'"
    site = tmp_path / "site-packages" / "rustyflow_py"  # not a checkout: no pyproject.toml
    monkeypatch.setattr(errors, "__file__", str(site / "errors.py"))
    assert install_command("hf") == "pip install 'rustyflow-py[hf]'"


def test_no_hint_in_the_package_names_a_bare_pip_install() -> None:
    """Every install hint comes from install_command: a literal `pip install` in a message
    would be the command that fails in the README's flow."""
    found = [f"{path.relative_to(REPO)}:{n}" for path in (REPO / "rustyflow_py").rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"""["'].*pip install""", line)]
    assert found == []
