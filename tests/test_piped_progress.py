"""Training's plain progress lines (stderr not a terminal: a pipe, CI, a file) show each step
once: a run that stops on a LOG_INTERVAL step once printed that step's line twice (the loss
read-back, then the epoch's end read the same step again)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TRAIN, subprocess_env

pytestmark = pytest.mark.usefixtures("tiny_dir")


@pytest.mark.parametrize("steps", ["8", "10"])  # on a LOG_INTERVAL (4) step, and between
def test_each_step_line_appears_once_when_piped(tiny_dir: Path, steps: str) -> None:
    run = subprocess.run([sys.executable, "-m", "rustyflow_py", *TRAIN, "--max-steps", steps],
                         cwd=tiny_dir, capture_output=True, text=True, timeout=300,
                         env=subprocess_env())
    assert run.returncode == 0, run.stderr
    shown = re.findall(r"^  step (\d+) ", run.stderr, re.M)
    assert shown == sorted(set(shown), key=int), run.stderr
    assert shown[-1] == steps
