"""benchmarks/quality_sweep.py: variants x seeds run as real training runs, their numbers read
from each run's record, failures kept as rows."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from helpers import REPO, load_script, log_records

pytestmark = pytest.mark.usefixtures("tiny_dir")


def _sweep() -> ModuleType:
    return load_script(REPO / "benchmarks" / "quality_sweep.py")


def test_a_sweep_tabulates_each_runs_record(capsys: pytest.CaptureFixture[str]) -> None:
    sweep = _sweep()
    code = sweep.main(["--config", "tiny.env", "--device", "cpu", "--seeds", "1,2",
                       "--variant", "base=", "--variant", "wd=--weight-decay 0.5",
                       "--extra", "--max-steps 3", "--parallel", "2", "--work", "runs",
                       "--out", "sweep.md"])
    assert code == 0
    text = Path("sweep.md").read_text()
    assert text == capsys.readouterr().out.rstrip("\n") + "\n"
    for name in ("base", "wd"):
        vals = []
        for seed in (1, 2):
            record = log_records(f"runs/{name}-s{seed}.log")[-1]
            assert record["status"] == "completed" and record["steps"] == 3
            vals.append(record["best_val_ppl"])
            row = f"| {name} | {seed} | completed | {record['best_val_ppl']:.2f} | "
            assert row in text, row
        assert vals[0] != vals[1]  # the seed reached the run
    assert "| wd | `--weight-decay 0.5` | 2 of 2 |" in text
    assert text.count("**") == 2  # one best mean


def test_a_failed_run_is_a_row_and_fails_the_sweep() -> None:
    sweep = _sweep()
    code = sweep.main(["--config", "tiny.env", "--device", "cpu", "--variant",
                       "bad=--learning-rate -1", "--work", "runs", "--out", "sweep.md"])
    assert code == 1
    text = Path("sweep.md").read_text()
    assert "| bad | 1337 | no run record (exit 1) |" in text
    assert "| bad | `--learning-rate -1` | 0 of 1 |" in text


def test_variants_are_checked() -> None:
    sweep = _sweep()
    with pytest.raises(SystemExit):
        sweep.main(["--config", "tiny.env", "--variant", "no flags given"])
    with pytest.raises(SystemExit):
        sweep.main(["--config", "tiny.env", "--variant", "a=", "--variant", "a=--seed 1"])
