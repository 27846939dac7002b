"""The README works as written and its example output is today's output.

- Every command in a README shell block runs in a fresh shell right after the set-up: it is a
  repository script (`./...`), never a bare `rustyflow` that needs an activated .venv.
- Each example block (written by scripts/readme_examples.py from a real run) has the form of
  the current output: a tiny run's output, reduced to its shape (numbers, paths and names
  replaced), must equal the example's shape. A changed line format fails here until the
  script is run again.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
sys.path.insert(0, str(REPO / "scripts"))

pytest.importorskip("pyte", reason="the dev extra's pyte renders the terminal")

from readme_examples import TINY_LOG_RUN, gpu_profile, seed_epoch, tiny_text  # noqa: E402
from screen import content, on_screen, shape  # noqa: E402

# Rows whose order follows measured times, so a run may list them in another order: each
# table's rows collapse to one tag. An op-table row (name phase category calls ...) and a
# roofline row (`  name [phase] 0.1 ms/step: ...`).
ROWS = {"OPS": re.compile(r"^\S+\s+\w+\s+(matmul|other|comm)\s+[\d,]+\s"),
        "ROOFLINE": re.compile(r"^  \S+ \[\w+\] [\d.]+ ms/step: ")}


def example(path: Path, name: str) -> list[str]:
    """The lines of the `name` example block of `path`."""
    text = path.read_text()
    body = text.split(f"<!-- example: {name} -->\n", 1)[1].split("<!-- end example -->")[0]
    lines = body.strip().splitlines()
    assert lines[0] == "```text" and lines[-1] == "```", body
    return lines[1:-1]


def form(lines: list[str]) -> str:
    """The shape of some output, whatever its wrapping: a table's rows become one tag, the
    machine's and the dataset's names `NAME`, then numbers and paths as `shape` does."""
    kept: list[str] = []
    for line in lines:
        if line.startswith(("numba ", "  found in ")):  # this machine's, not the format's
            continue
        row = next((tag for tag, rule in ROWS.items() if rule.match(line)), line)
        if not (row in ROWS and kept and kept[-1] == row):
            kept.append(row)
    text = re.sub(r"-{3,}", "---", " ".join(kept))  # table rules as wide as their columns
    for wrapper in ("python -m rustyflow_py", "./rustyflow"):  # errors.command(): either
        text = text.replace(wrapper, "rustyflow")
    hardware = re.search(r"\(requested \w+\) \| ([^|]+?) \|", text)
    names = [hardware.group(1)] if hardware else []
    return shape(text, [*names, "wikitext-2", "words.txt", "tiny.txt", "words", "tiny"])


def test_every_readme_command_works_in_a_fresh_shell() -> None:
    """Each command line in a bash block starts with `./`: the scripts and the ./rustyflow
    wrapper bootstrap .venv themselves, so nothing needs activating first."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    commands = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    commands = [c for c in commands if c]
    assert commands and all(c.startswith("./") for c in commands), commands
    for command in commands:
        assert (REPO / command.split()[0]).is_file(), command


def test_the_quick_start_example_has_the_current_form(tmp_path: Path) -> None:
    """The README's quick start screen against a tiny run of the same config on a tiny text,
    both rendered by the terminal emulator, banner first as the train scripts print it."""
    (tmp_path / "words.txt").write_text(tiny_text())
    tiny = ["--config", str(REPO / "configs" / "quick.env"), "--device", "cpu", "--dataset",
            "words.txt", "--batch-size", "4", "--seq-len", "8", "--embed-dim", "16",
            "--num-heads", "2", "--num-layers", "1", "--eval-tokens", "256"]
    run = " ".join([sys.executable, "-m", "rustyflow_py"])
    script = f"{run} banner {' '.join(tiny)} && exec {run} train {' '.join(tiny)}"
    screen, status = on_screen(["bash", "-c", script], tmp_path, cols=300, rows=200)
    assert status == 0, "\n".join(screen)
    assert form(example(README, "quick start")) == form(content(screen))


def test_the_log_block_example_has_the_current_form(tmp_path: Path) -> None:
    (tmp_path / "tiny.txt").write_text(tiny_text())
    subprocess.run([sys.executable, "-m", "rustyflow_py", *TINY_LOG_RUN], cwd=tmp_path,
                   check=True, capture_output=True, timeout=300)
    block = (tmp_path / "training_log.txt").read_text().splitlines()
    documented = example(REPO / "docs" / "log-format.md", "log block")
    runs = [line for line in block if not line.startswith("[RUN_JSON]")]
    assert form([x for x in documented if not x.startswith("[RUN_JSON]")]) == form(runs)
    assert sum(x.startswith("[RUN_JSON] {") for x in documented) == 1


def test_the_gpu_profile_example_is_todays_rendering_of_the_committed_run() -> None:
    """README's GPU profile is a real H100 run's record (committed under benchmarks/results)
    rendered by the current report code, line for line."""
    assert example(README, "gpu profile") == gpu_profile()


def test_the_seed_epoch_figures_are_the_committed_logs_own() -> None:
    """docs/benchmarks.md quotes the seed epoch's times and perplexities as `report` renders
    the committed logs today, line for line: a figure typed by hand could go stale."""
    assert example(REPO / "docs" / "benchmarks.md", "seed epoch") == seed_epoch()
