"""benchmarks/quality_sweep.py: variants x seeds run as real training runs, their numbers read
from each run's record, failures kept as rows."""

from __future__ import annotations

import threading
import time
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
    assert "LEARNING_RATE" in Path("runs/bad-s1337.out").read_text()  # why it failed, kept


def test_a_variant_may_name_its_own_seeds() -> None:
    sweep = _sweep()
    code = sweep.main(["--config", "tiny.env", "--device", "cpu", "--seeds", "1",
                       "--variant", "final@3,4=", "--variant", "wd=--weight-decay 0.5",
                       "--extra", "--max-steps 1", "--parallel", "3", "--work", "runs"])
    assert code == 0
    assert sorted(p.name for p in Path("runs").glob("*.log")) == [
        "final-s3.log", "final-s4.log", "wd-s1.log"]
    assert log_records("runs/final-s4.log")[-1]["seed"] == 4


def test_variants_are_checked() -> None:
    sweep = _sweep()
    for bad in ("a@x=", "a@=", "@1=", "a@1,1="):
        with pytest.raises(SystemExit):
            sweep.main(["--config", "tiny.env", "--variant", bad])
    with pytest.raises(SystemExit):
        sweep.main(["--config", "tiny.env", "--variant", "no flags given"])
    with pytest.raises(SystemExit):
        sweep.main(["--config", "tiny.env", "--variant", "a=", "--seeds", "2,2"])
    with pytest.raises(SystemExit):
        sweep.main(["--config", "tiny.env", "--variant", "a=", "--variant", "a=--seed 1"])


def test_with_devices_no_two_runs_share_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """--devices: each run gets a device no other running run holds, and every device is
    used (the runs themselves replaced by a recorder of their command's device)."""
    sweep = _sweep()
    lock, running, seen = threading.Lock(), set(), []

    def fake_run(cmd: list[str], log: Path, variant: object, seed: int,
                 timeout: float) -> object:
        device = cmd[cmd.index("--device") + 1]
        with lock:
            assert device not in running
            running.add(device)
            seen.append(device)
        time.sleep(0.05)
        with lock:
            running.discard(device)
        return sweep.Result(variant, seed, "completed", 1.0, 1.0, 1.0)

    monkeypatch.setattr(sweep, "run_one", fake_run)
    code = sweep.main(["--config", "tiny.env", "--devices", "gpu:0,gpu:1,gpu:2",
                       "--seeds", "1,2,3", "--variant", "a=", "--variant", "b=",
                       "--work", "runs", "--out", "sweep.md"])
    assert code == 0 and len(seen) == 6 and set(seen) == {"gpu:0", "gpu:1", "gpu:2"}
    assert "one at a time on each of gpu:0, gpu:1, gpu:2" in Path("sweep.md").read_text()


def test_the_table_is_written_after_each_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep stopped from outside leaves the rows of the runs it finished: when the second
    run starts, --out already holds the first run's numbers and the second's row."""
    sweep = _sweep()
    tables = []

    def fake_run(cmd: list[str], log: Path, variant: object, seed: int,
                 timeout: float) -> object:
        tables.append(Path("sweep.md").read_text() if Path("sweep.md").exists() else "")
        return sweep.Result(variant, seed, "completed", 90.0 + seed, 80.0, 1.0)

    monkeypatch.setattr(sweep, "run_one", fake_run)
    assert sweep.main(["--config", "tiny.env", "--seeds", "1,2", "--variant", "a=",
                       "--work", "runs", "--out", "sweep.md"]) == 0
    assert tables[0] == ""
    assert "| a | 1 | completed | 91.00 |" in tables[1]
    assert "| a | 2 | not finished |" in tables[1]
    assert "| a | 2 | completed | 92.00 |" in Path("sweep.md").read_text()
