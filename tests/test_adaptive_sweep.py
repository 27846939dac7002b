"""benchmarks/adaptive_sweep.py: each row is what `eval --adapt` prints for its settings on
the same tokens, beside the model alone; its grids are checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import REPO, invoke, load_script

NUMBER = r"(\d+\.\d{3})"


def test_a_row_is_the_command_s_result_for_its_settings(workspace: Path) -> None:
    sweep = load_script(REPO / "benchmarks" / "adaptive_sweep.py")
    sweep.main(["--model", "models/tiny-cpu.npz", "--device", "cpu", "--eval-tokens", "300",
                "--cache", "theta=0.1,0.3 lambda=0.2", "--dynamic", "lr=0.05 segment=8",
                "--out", "sweep.md"])
    rows = [r.split(" | ") for r in Path("sweep.md").read_text().splitlines()
            if r.startswith("| cache ") or r.startswith("| dynamic ")]
    assert len(rows) == 3
    for method, flags, adaptive, alone, _ in rows:
        said = invoke("eval", "--model", "models/tiny-cpu.npz", "--device", "cpu",
                      "--eval-tokens", "300", "--adapt", method.removeprefix("| "),
                      *flags.split())
        assert said.exit_code == 0, said.output
        found = re.search(rf"with adaptive evaluation \(.*\); the model alone: {NUMBER}$",
                          said.output, re.M)
        line = re.search(rf"^valid perplexity {NUMBER} with", said.output, re.M)
        assert (line.group(1), found.group(1)) == (adaptive, alone)


@pytest.mark.parametrize(("grid", "said"), [("lr=0.1", "lr is not one of its settings"),
                                           ("theta", "'theta' is not key=number"),
                                           ("theta=a,b", "'theta=a,b' is not key=number")])
def test_a_grid_it_cannot_read_is_refused_in_one_line(workspace: Path, grid: str,
                                                      said: str) -> None:
    sweep = load_script(REPO / "benchmarks" / "adaptive_sweep.py")
    with pytest.raises(SystemExit, match=said):
        sweep.main(["--model", "models/tiny-cpu.npz", "--device", "cpu", "--cache", grid])
