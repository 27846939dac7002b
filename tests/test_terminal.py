"""The terminal display, as a person sees it: the real `rustyflow train` output rendered by a
terminal emulator (pyte) behind a pseudo-terminal, and the final screen checked line by line.

On a terminal one live region owns the bottom of the screen and every finished line prints
above it: no line is glued to a bar or overwritten, the epoch bar ends at its total, and the
token count of an evaluation is the same in every line about it. Through a pipe the same run
prints plain lines with no control code at all.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyte", reason="the dev extra's pyte renders the terminal")

from screen import BAR, bar_counts, content, on_screen  # noqa: E402  (after the skip)

# A tiny model on a tiny text: a run takes a second or two.
TINY = ["train", "--device", "cpu", "--dataset", "words.txt", "--batch-size", "4", "--seq-len",
        "8", "--embed-dim", "16", "--num-heads", "2", "--num-layers", "1", "--cpu-jit", "off",
        "--log-interval", "2", "--no-profile", "--warmup-steps", "1"]
RUSTYFLOW = [sys.executable, "-m", "rustyflow_py"]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A folder with words.txt: 20,000 tokens of a 40-word vocabulary (an epoch of about a
    second, so an interrupt lands mid-epoch)."""
    words = [f"w{i}" for i in range(40)]
    lines = [" ".join(words[(7 * i + 3 * j) % 40] for j in range(10)) for i in range(2000)]
    (tmp_path / "words.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_the_final_screen_of_two_epochs(workdir: Path) -> None:
    screen, status = on_screen([*RUSTYFLOW, *TINY, "--num-epochs", "2"], workdir)
    lines = content(screen)
    text = "\n".join(lines)
    assert status == 0, text
    # The live region's last state is the bottom line: the last epoch's bar, at its total.
    assert lines[-1].startswith("epoch 2/2 ") and BAR in lines[-1], text
    done, total = bar_counts(lines[-1])
    assert done == total > 0, text
    # Every other line is a finished line: no bar glyph glued into it, none overwritten.
    assert not any(BAR in line for line in lines[:-1]), text
    for epoch in (1, 2):
        assert sum(bool(re.fullmatch(rf"epoch {epoch}/2: [0-9.]+s", line))
                   for line in lines) == 1, text
    checks = [re.fullmatch(r"step (\d+): validation perplexity [0-9.]+ on ([0-9,]+) tokens",
                           line) for line in lines]
    validations = [m for m in checks if m]
    assert [int(m.group(1)) for m in validations] == [total, 2 * total], text
    # One token count: the evaluation lines say the count the validation lines say.
    evaluated = re.findall(r"^  evaluated valid: ([0-9,]+) tokens in ", text, re.M)
    assert evaluated == [m.group(2) for m in validations], text
    assert re.search(r"^  evaluated test: [0-9,]+ tokens in ", text, re.M), text
    assert re.search(r"^=== RustyFlow run .* completed ", text, re.M), text


def test_the_final_screen_of_an_interrupted_run(workdir: Path) -> None:
    def started(screen: list[str]) -> bool:  # the bar shows a few steps done
        bars = [line for line in screen if line.startswith("epoch ") and BAR in line]
        return bool(bars) and bar_counts(bars[-1])[0] >= 4

    screen, status = on_screen([*RUSTYFLOW, *TINY, "--num-epochs", "50"], workdir,
                               interrupt=started)
    lines = content(screen)
    text = "\n".join(lines)
    assert status == 130, text
    stopped = [re.fullmatch(r"Interrupted at step (\d+) \(.*\): saving checkpoint and log block",
                            line) for line in lines]
    assert any(stopped), text
    assert re.search(r"^=== RustyFlow run .* interrupted ", text, re.M), text
    assert lines[-1].startswith("epoch 1/50 ") and BAR in lines[-1], text
    assert not any(BAR in line for line in lines[:-1]), text
    step = int(next(m for m in stopped if m).group(1))
    assert bar_counts(lines[-1])[0] == step < bar_counts(lines[-1])[1], text  # mid-epoch


def test_a_pipe_gets_plain_lines(workdir: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "rustyflow_py", *TINY,
                             "--max-steps", "6"], cwd=workdir, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout + result.stderr and "\r" not in result.stderr
    assert "epoch 1/1: 6 steps" in result.stderr
    assert re.search(r"^  step 6 \(epoch 1, batch 6\): loss [0-9.]+  [0-9,]+ tok/s$",
                     result.stderr, re.M), result.stderr
    assert re.search(r"^  evaluating valid: [0-9,]+ tokens \.\.\.$", result.stderr, re.M)
    assert re.search(r"^step 6: validation perplexity", result.stdout, re.M), result.stdout
