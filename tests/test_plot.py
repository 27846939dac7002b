"""`rustyflow plot`: the pictures from committed logs (with matplotlib), and one clear line
saying how to get matplotlib when it is missing."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rustyflow_py.cli import main
from rustyflow_py.errors import install_command
from rustyflow_py.reporting import plot
from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.reporting.profile_text import roofline

RUNS = Path(__file__).resolve().parents[1] / "benchmarks/results/runs"
CURVES_LOG = RUNS / "curves-cpu.log"
OLD_LOGS = [RUNS / "seed-epoch-cpu-amd-epyc-2core.log", RUNS / "seed-epoch-h100.log"]
GRAPH_LOG = RUNS / "h100-seed-graph-profile.log"


def records(*paths: Path) -> list[dict]:
    return [r for p in paths for r in read_log(p)]


def test_selecting_runs_by_timestamp_or_count() -> None:
    runs = records(*OLD_LOGS)
    stamps = [r["timestamp"] for r in runs]
    assert plot.select(runs) == runs
    assert plot.select(runs, last=1) == runs[-1:]
    assert plot.select(runs, runs=[stamps[0]]) == runs[:1]
    with pytest.raises(plot.PlotError, match="no run with timestamp 1999"):
        plot.select(runs, runs=["1999"])


def test_without_matplotlib_the_command_says_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    with pytest.raises(plot.PlotError, match=re.escape(install_command("plot"))):
        plot.pyplot()
    result = CliRunner().invoke(main, ["plot", "--log", str(CURVES_LOG), "--out",
                                       str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: matplotlib is not installed, and pictures need it: {install_command('plot')}"]
    assert list(tmp_path.iterdir()) == []


def test_all_three_pictures_from_the_committed_logs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    written, skipped = plot.plot_runs(records(CURVES_LOG, *OLD_LOGS), tmp_path)
    assert [s.split(":")[0] for s in skipped] == ["roofline"]  # logged before peaks were
    names = sorted(p.name for p in written)
    assert names == sorted(f"{stem}.{fmt}" for stem in ("loss-curves", "op-breakdown",
                                                         "cpu-vs-gpu") for fmt in plot.FORMATS)
    for path in written:
        head = path.read_bytes()[:8]
        assert head.startswith(b"\x89PNG") if path.suffix == ".png" else b"<?xml" in head


def test_pictures_a_log_cannot_give_are_named_not_drawn(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    written, skipped = plot.plot_runs(records(OLD_LOGS[0]), tmp_path)
    assert sorted(p.name for p in written) == ["op-breakdown.png", "op-breakdown.svg"]
    assert [s.split(":")[0] for s in skipped] == ["loss-curves", "roofline", "cpu-vs-gpu"]


def test_roofline_of_a_graph_profile(tmp_path: Path) -> None:
    """A real H100 run's graph profile (committed log) draws its roofline: GEMM ops against
    the table's fp32 roof, the other ops against the bandwidth."""
    pytest.importorskip("matplotlib")
    log = records(GRAPH_LOG)
    written, skipped = plot.plot_runs(log, tmp_path, formats=("png",))
    assert "roofline.png" in {p.name for p in written}, skipped
    prof = log[-1]["profile"]
    rows = roofline(prof["ops"], prof["peaks"], "fp32", prof["profiled_steps"])
    gemms = [r for r in rows if r["kind"] == "GEMM fp32"]
    assert gemms and all(r["peak"] == 67.0 and 0 < r["share"] < 1 for r in gemms)
    assert any(r["kind"] == "memory" and r["peak"] == 3350.0 for r in rows)


def test_plot_command(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "pictures"
    result = CliRunner().invoke(main, ["plot", "--log", str(CURVES_LOG), "--last", "1",
                                       "--out", str(out), "--format", "png"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["loss-curves.png", "op-breakdown.png"]
    assert "not drawn: roofline" in result.output and "not drawn: cpu-vs-gpu" in result.output
    missing = CliRunner().invoke(main, ["plot", "--log", str(tmp_path / "nope.txt")])
    assert missing.exit_code == 1 and "not found" in missing.output
