"""The run record's curves: written by a run, bounded for long runs, kept across a resume, and
absent from older blocks without breaking anything that reads them."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import TINY, quiet

from rustyflow_py.model.optim import Schedule
from rustyflow_py.reporting.curves import MAX_POINTS, curve, evenly_spaced, sparkline
from rustyflow_py.reporting.log_parser import parse_log, read_log
from rustyflow_py.reporting.report_page import render_report
from rustyflow_py.training.config.config import Config, load_config
from rustyflow_py.training.outputs.record import _curves
from rustyflow_py.training.run.loop import Trainer

pytestmark = pytest.mark.usefixtures("tiny_dir")

OLD_LOG = Path(__file__).resolve().parents[1] / "benchmarks/results/runs/seed-epoch-h100.log"


def tiny_cfg(**changes: object) -> Config:
    cfg, _ = load_config(None, {**TINY, **changes}, environ={})
    return cfg


@pytest.mark.parametrize(("count", "limit"), [(0, 5), (3, 5), (5, 5), (6, 5), (2039, 500),
                                              (10_000, 500), (7, 2), (7, 1)])
def test_evenly_spaced_keeps_the_ends_and_at_most_limit(count: int, limit: int) -> None:
    picked = evenly_spaced(count, limit)
    assert len(picked) == min(count, limit)
    assert picked == sorted(set(picked))
    if count > limit > 1:
        gaps = {b - a for a, b in zip(picked, picked[1:], strict=False)}
        assert max(gaps) - min(gaps) <= 1  # evenly spaced
    if count:
        assert picked[-1] == count - 1
        assert limit == 1 or picked[0] == 0


def test_evenly_spaced_rejects_a_zero_limit() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        evenly_spaced(10, 0)


def test_sparkline_shows_the_shape() -> None:
    assert sparkline([]) == ""
    assert sparkline([3.0, 2.0, 1.0]) == "█▅▁"
    assert sparkline([5.0] * 4) == "▁▁▁▁"
    assert len(sparkline([float(i) for i in range(1000)], width=40)) == 40


def test_a_run_writes_its_loss_lr_and_validation_curves() -> None:
    trainer = Trainer(tiny_cfg(NUM_EPOCHS=2, EVAL_INTERVAL=10), quiet)
    record = trainer.run()
    assert record is not None
    curves, losses = record["curves"], trainer.losses
    assert curves["losses"] == len(losses) == 58 and curves["limit"] == MAX_POINTS
    assert [s for s, _ in curves["loss"]] == list(range(1, 59))
    assert all(math.isclose(v, losses[s - 1], rel_tol=1e-5) for s, v in curves["loss"])
    schedule = trainer.optimizer.schedule
    assert all(math.isclose(v, float(schedule(s)), rel_tol=1e-5) for s, v in curves["lr"])
    # every EVAL_INTERVAL steps and at each epoch's end (29, 58), each step once
    assert [s for s, _ in curves["val_ppl"]] == [10, 20, 29, 30, 40, 50, 58]
    assert math.isclose(curves["val_ppl"][-1][1], record["val_ppl"], rel_tol=1e-5)
    (back,) = read_log("log.txt")
    assert curve(back, "loss") == [tuple(p) for p in curves["loss"]]


def test_long_runs_keep_a_bounded_curve() -> None:
    losses = [10.0 / (1 + i) for i in range(12_345)]
    fake = SimpleNamespace(losses=losses, optimizer=SimpleNamespace(
        schedule=Schedule(1e-3, 100, 12_345, 0.1)), history=SimpleNamespace(
        val_curve=[[s, 100.0 - s / 1000] for s in range(10, 12_346, 10)]))
    curves = _curves(fake)
    assert len(curves["loss"]) == len(curves["lr"]) == MAX_POINTS
    assert len(curves["val_ppl"]) == MAX_POINTS
    assert curves["loss"][0][0] == 1 and curves["loss"][-1][0] == 12_345
    assert curves["val_ppl"][-1][0] == 12_340


def test_a_resumed_run_keeps_the_whole_validation_curve() -> None:
    first = Trainer(tiny_cfg(NUM_EPOCHS=2, MAX_STEPS=29), quiet).run()
    assert first is not None and [s for s, _ in first["curves"]["val_ppl"]] == [29]
    resumed = Trainer(tiny_cfg(NUM_EPOCHS=2), quiet, resume=first["checkpoint"]).run()
    assert resumed is not None
    assert [s for s, _ in resumed["curves"]["val_ppl"]] == [29, 58]
    assert resumed["curves"]["losses"] == 58


def test_blocks_written_before_curves_still_parse_and_report() -> None:
    records = read_log(OLD_LOG)
    assert records and all("curves" not in r for r in records)
    assert curve(records[-1], "loss") == [] and curve(records[-1], "val_ppl") == []
    text = render_report(records)
    assert "Loss curve" not in text and "Latest profiling report" in text


def test_report_shows_the_latest_loss_curve_as_a_sparkline() -> None:
    Trainer(tiny_cfg(NUM_EPOCHS=1, EVAL_INTERVAL=10), quiet).run()
    records = parse_log(Path("log.txt").read_text() + OLD_LOG.read_text())
    text = render_report(records)  # the curve comes from the run that has one
    assert "Loss curve: run" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("training loss"))
    assert any(c in line for c in "▁▂▃▄▅▆▇█") and "at step 1 ->" in line
    assert any(ln.startswith("validation ppl") for ln in text.splitlines())


def test_malformed_curve_points_are_skipped() -> None:
    record = {"curves": {"loss": [[1, 2.0], [2, None], "x", [3], [4, float("nan")], [5, 1.0]]}}
    assert curve(record, "loss") == [(1, 2.0), (5, 1.0)]
    assert curve({"curves": "nonsense"}, "loss") == []

