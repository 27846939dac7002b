"""`rustyflow bench` on a tiny grid on the CPU (the GPU said to be not usable), and the
crossover and Amdahl summaries on made-up rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rustyflow_py.cli import main
from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.model.gpt import build_model
from rustyflow_py.reporting.sweep import amdahl, crossover, format_sweep
from rustyflow_py.training import bench

VOCAB = 97  # small: the tiny grid is about the plumbing, not the numbers


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUSTYFLOW_DISABLE_GPU", "1")


def test_tiny_grid_on_the_cpu(no_gpu: None, tmp_path: Path) -> None:
    points = bench.grid(bench.QUICK_MODELS, bench.QUICK_BATCHES)
    result = bench.sweep(points, VOCAB, seconds=0.0, say=lambda _: None)
    assert result["devices"]["gpu"] == {"usable": False,
                                        "reason": "RUSTYFLOW_DISABLE_GPU is set"}
    assert len(result["rows"]) == len(points) == 2
    for point, row in zip(points, result["rows"], strict=True):
        model = build_model(point.config("cpu"), VOCAB)
        assert row["flops_per_step"] == model.matmul_flops_per_step(point.batch, point.seq_len)
        assert row["params"] == model.num_params()
        cpu = row["cpu"]
        assert cpu["steps"] >= bench.MIN_STEPS and cpu["ms_per_step"] > 0
        assert cpu["tokens_per_s"] == pytest.approx(
            point.batch * point.seq_len * 1e3 / cpu["ms_per_step"])
        assert 0 < cpu["matmul_share"] < 1 and cpu["graph"] is False
        assert "gpu" not in row and row["speedup"] is None
    md = bench.write_results(result, tmp_path, say=lambda _: None).read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| L1 E32 H2 | 2 × 16 |"))
    assert row.endswith("| not usable: RUSTYFLOW_DISABLE_GPU is set |")
    assert "No crossover: the GPU was not measured." in md
    assert "- CPU: matmul is" in md
    assert json.loads((tmp_path / "bench.json").read_text())["rows"][0]["layers"] == 1
    assert not (tmp_path / "speedup.png").exists()  # nothing to plot without the GPU


@pytest.mark.gpu
@pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))
def test_tiny_grid_on_both_devices(tmp_path: Path) -> None:
    points = bench.grid(bench.QUICK_MODELS, bench.QUICK_BATCHES[:1])
    result = bench.sweep(points, VOCAB, seconds=0.0, say=lambda _: None)
    (row,) = result["rows"]
    assert row["gpu"]["graph"] is True and row["speedup"] > 0
    assert 0 < row["gpu"]["matmul_share"] < 1


def rows(*pairs: tuple[float, float]) -> list[dict]:
    """Made-up rows: (GFLOP per step, GPU/CPU speed-up)."""
    return [{"layers": 1, "embed": 64, "heads": 2, "batch": 1, "seq_len": 32,
             "flops_per_step": g * 1e9, "speedup": s,
             "cpu": {"matmul_share": 0.5 + g / 100}, "gpu": {"matmul_share": 0.2}}
            for g, s in pairs]


def test_crossover_is_the_smallest_step_the_gpu_wins() -> None:
    text = crossover(rows((8.0, 3.0), (0.5, 0.4), (2.0, 1.5), (1.0, 0.8)))
    assert text.startswith("The GPU starts to win at 2 GFLOP/step")
    assert "by 1.50x" in text and "at the next smaller step, 1 GFLOP/step" in text
    assert "the CPU is 1.25x faster" in text and "still wins" not in text


def test_crossover_below_the_grid_nowhere_and_with_exceptions() -> None:
    assert "the crossover lies below this grid" in crossover(rows((1.0, 2.0), (4.0, 9.0)))
    assert crossover(rows((1.0, 0.5), (4.0, 0.9))).startswith(
        "The GPU wins nowhere on this grid: its best is 0.90x at 4 GFLOP/step")
    assert "Above it the CPU still wins at 4 GFLOP/step" in crossover(
        rows((1.0, 0.5), (2.0, 1.2), (4.0, 0.9)))


def test_amdahl_lines_give_the_range_and_the_bound() -> None:
    lines = amdahl(rows((10.0, 1.0), (30.0, 2.0)))
    assert lines[0].startswith("- CPU: matmul is 60% (L1 E64 H2, 1 × 32) to 80%")
    assert "at most 2.50x to 5.00x faster" in lines[0]
    assert lines[1].startswith("- GPU: matmul is 20%")


def test_markdown_with_the_gpu_measured() -> None:
    cell = {"ms_per_step": 2.0, "tokens_per_s": 16_000.0, "matmul_share": 0.5}
    made_up = rows((1.0, 4.0), (9.0, None))
    for row, gpu in zip(made_up, (cell, {"error": "out of memory (x)"}), strict=True):
        row.update(params=1234, cpu=cell, gpu=gpu)
    sweep = {"vocab": 33278, "seconds": 1.0, "rows": made_up,
             "devices": {"cpu": {"describe": "a CPU"},
                         "gpu": {"usable": True, "describe": "a GPU"}}}
    text = format_sweep(sweep, "speedup.png")
    assert "- GPU: a GPU" in text and text.rstrip().endswith("(speedup.png)")
    assert "| L1 E64 H2 | 1 × 32 | 1,234 | 1 | 2.00 | 16,000 | 50 | 2.00 | 16,000 | 50 | 4.00x |" \
        in text
    assert "| out of memory (x) |  |  | n/a |" in text


def test_speedup_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from rustyflow_py.reporting.plot import plot_sweep

    paths = plot_sweep(rows((0.5, 0.4), (2.0, 1.5), (8.0, 3.0)), tmp_path / "speedup")
    assert sorted(p.name for p in paths) == ["speedup.png", "speedup.svg"]


def test_bench_command(no_gpu: None, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["bench", "--quick", "--vocab", str(VOCAB), "--seconds", "0",
                                  "--batch", "2x16", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "cpu L1 E32 H2 B2 T16:" in result.output and "## Crossover" in result.output
    assert (tmp_path / "bench.md").is_file()
    again = runner.invoke(main, ["bench", "--from-json", str(tmp_path / "bench.json"), "--out",
                                 str(tmp_path / "again")])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "again/bench.md").read_text() == (tmp_path / "bench.md").read_text()
    for bad, message in ((["--model", "2x128"], "--model '2x128': expected 3 positive"),
                         (["--model", "1x30x4"], "EMBED_DIM=30"),
                         (["--batch", "0x16"], "--batch '0x16'")):
        out = runner.invoke(main, ["bench", *bad, "--out", str(tmp_path)])
        assert out.exit_code == 1 and message in out.output, out.output
