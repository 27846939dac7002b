"""benchmarks/scaling_model.py and allreduce_sweep.py's pure parts: the overlap arithmetic on
hand-computable cases, the all-reduce formulas, the fit, the validation's error, and that every
assumed input says so."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from helpers import REPO, load_script

SCALING_X4 = REPO / "benchmarks" / "results" / "scaling-h200x4.json"


@pytest.fixture(scope="module")
def sm() -> ModuleType:
    return load_script(REPO / "benchmarks" / "scaling_model.py")


@pytest.fixture(scope="module")
def sweep() -> ModuleType:
    return load_script(REPO / "benchmarks" / "allreduce_sweep.py")


def constant(ms: float):  # a reduce that takes `ms` whatever its size
    return lambda _nbytes: ms


def test_one_bucket_ready_at_the_end_exposes_its_whole_reduce(sm: ModuleType) -> None:
    t = sm.overlap([sm.Bucket(100, 10.0)], 10.0, constant(3.0))
    assert (t.comm_ms, t.end_ms, t.exposed_ms) == (3.0, 13.0, 3.0)


def test_early_buckets_are_hidden_and_only_the_tail_sticks_out(sm: ModuleType) -> None:
    buckets = [sm.Bucket(1, 2.0), sm.Bucket(1, 5.0), sm.Bucket(1, 9.0)]
    t = sm.overlap(buckets, 10.0, constant(2.0))
    # 2-4, 5-7 hidden; the last runs 9-11: 1 ms after backward's end at 10
    assert (t.comm_ms, t.end_ms, t.exposed_ms) == (6.0, 11.0, 1.0)


def test_a_backlog_on_the_side_stream_delays_later_buckets(sm: ModuleType) -> None:
    # all ready at 1 ms, 4 ms each, one after another: 1-5, 5-9, 9-13; backward ends at 10
    t = sm.overlap([sm.Bucket(1, 1.0)] * 3, 10.0, constant(4.0))
    assert t.end_ms == 13.0 and t.exposed_ms == 3.0


def test_the_order_is_backward_completion_not_the_list(sm: ModuleType) -> None:
    late_first = [sm.Bucket(1, 9.0), sm.Bucket(1, 2.0)]
    assert sm.overlap(late_first, 10.0, constant(2.0)).exposed_ms == 1.0


def test_ring_all_reduce_and_its_halves(sm: ModuleType) -> None:
    link = sm.Link(alpha_ms=0.01, busbw_gbs=100.0)  # 100 GB/s = 1e8 bytes per ms
    assert link.all_reduce_ms(1e8, 4) == pytest.approx(0.01 + 1.5)  # 2 (4-1)/4 = 1.5
    assert link.half_ms(1e8, 4) == pytest.approx(0.01 + 0.75)
    assert link.all_reduce_ms(1e8, 1) == 0.0


def test_across_nodes_the_network_carries_each_gpus_shard(sm: ModuleType) -> None:
    net = sm.Network({8: sm.Link(0.0, 100.0)}, inter_gbps=400.0, inter_latency_ms=0.02)
    # node: 2 x 7/8 x 1e8 / 1e8 = 1.75 ms; network: 0.02 + 2 x 1/2 x (1e8 / 8) / 5e7 = 0.27
    assert net.all_reduce_ms(1e8, 16) == pytest.approx(1.75 + 0.27)
    assert net.all_reduce_ms(1e8, 8) == pytest.approx(1.75)
    assert net.link(2) == net.link(8)  # an unmeasured count takes the largest measured


def inputs(sm: ModuleType, buckets: list, **kw):
    base = {"step_ms": 20.0, "backward_ms": 10.0, "optimizer_ms": 2.0,
            "tokens_per_step": 1000, "buckets": tuple(buckets), "param_bytes": 0,
            "labels": {}}
    return sm.StepInputs(**{**base, **kw})


def test_prediction_adds_exposed_and_the_charged_share_of_hidden(sm: ModuleType) -> None:
    net = sm.Network({2: sm.Link(0.0, 1.0)}, 400.0, 0.0)  # 1 GB/s: 1e6 bytes = 1 ms at n=2
    step = inputs(sm, [sm.Bucket(10**6, 2.0), sm.Bucket(2 * 10**6, 10.0)])
    p = sm.predict(step, net, 2)
    assert (p.comm_ms, p.exposed_ms, p.step_ms) == (3.0, 2.0, 22.0)
    assert p.speedup == pytest.approx(2 * 20 / 22) and p.efficiency == pytest.approx(20 / 22)
    assert p.tokens_per_s == pytest.approx(2000 / 22e-3)
    assert sm.predict(step, net, 2, contention=0.5).step_ms == 22.5  # + 0.5 x 1 ms hidden
    assert sm.predict(step, net, 1).step_ms == 20.0


def test_zero1_pays_both_halves_and_saves_the_optimizer_share(sm: ModuleType) -> None:
    net = sm.Network({2: sm.Link(0.0, 1.0)}, 400.0, 0.0)
    step = inputs(sm, [sm.Bucket(2 * 10**6, 5.0)], param_bytes=4 * 10**6)
    p = sm.predict(step, net, 2, zero1=True)
    # reduce-scatter 1/2 x 2e6 -> 1 ms, all-gather 1/2 x 4e6 -> 2 ms; optimizer 2 ms -> 1
    assert p.exposed_ms == 3.0 and p.step_ms == 20.0 - 1.0 + 3.0


def test_bus_bandwidth_is_nccl_tests_convention(sweep: ModuleType) -> None:
    algbw, busbw = sweep.bus_bandwidth(10**9, 0.01, 4)
    assert algbw == pytest.approx(100.0) and busbw == pytest.approx(150.0)
    assert sweep.sizes() == [4**k * 1024 for k in range(11)]  # 1 KiB .. 1 GiB


def test_the_fit_recovers_a_sweeps_alpha_and_busbw(sm: ModuleType, sweep: ModuleType,
                                                   tmp_path: Path) -> None:
    link = sm.Link(0.02, 300.0)
    points = [sweep.point(d, b, link.all_reduce_ms(b, 4) / 1e3, 4)
              for d in ("bf16", "fp32") for b in sweep.sizes()]
    assert points[-1]["busbw_gbs"] < 300.0  # the latency costs a little even at 1 GiB
    data = sweep.sweep_json(points, 4, "GPU", {"nccl": "x"})
    assert set(data) == {"kind", "gpus", "machine", "versions", "timing", "points"}
    assert set(points[0]) == {"dtype", "bytes", "ms", "algbw_gbs", "busbw_gbs"}
    f = tmp_path / "sweep.json"
    f.write_text(json.dumps(data))
    args = sm.parse_args(["--step", "x", "--sweep", str(f)])
    net, labels = sm.sweep_network([str(f)], "fp32", args)
    assert net.links[4].alpha_ms == pytest.approx(0.02)
    assert net.links[4].busbw_gbs == pytest.approx(300.0)
    assert labels["4 GPUs"].startswith("measured: ")
    assert labels["8 GPUs"].startswith("assumed: ") and labels["2 GPUs"].startswith("assumed")


def test_validation_error_and_implied_contention(sm: ModuleType) -> None:
    assert sm.errors(39.0, 40.0) == pytest.approx(-0.025)
    p = sm.Prediction(2, step_ms=21.0, tokens_per_s=1.0, speedup=1.9, efficiency=0.95,
                      comm_ms=3.0, exposed_ms=1.0)
    row = sm.validation_row("f.json", 20.0, 2, 22.0, p)
    # error (21 - 22) / 22; contention that makes it exact: (2 - 1) / (3 - 1)
    assert row == "| f.json | 20.00 | 2 | 22.00 | 21.00 | -4.5% | 2.00 | 1.00 | 0.50 |"


def test_buckets_come_from_the_trainers_layout(sm: ModuleType) -> None:
    small = json.loads(SCALING_X4.read_text())["small"]["1"]
    shape = sm.Shape(6, 6, 384, 256, 32, 33278)
    buckets = sm.code_buckets(shape, 25.0)
    assert sum(n for n, _ in buckets) == small["params"]
    assert buckets[0][1] == ["wte"]  # the buffer starts with the tied embedding, alone
    est = sm.estimated_buckets(shape, 25.0, 4, 6.0)
    assert est[0].ready_ms == 6.0  # wte completes with the embedding's backward, last


def test_every_assumed_input_is_labelled_assumed(sm: ModuleType, capsys) -> None:
    code = sm.main(["--scaling", str(SCALING_X4), "--shape", "medium",
                    "--backward-fraction", "0.6", "--validate", str(SCALING_X4)])
    out = capsys.readouterr().out
    assert code == 0
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines()
            if line.startswith("| ") and " | " in line}
    for name in ("backward", "all-reduce, 8 GPUs", "network", "contention"):
        assert "| assumed" in rows[name], rows[name]
    for name in ("1-GPU step", "all-reduce, 2 GPUs", "all-reduce, 4 GPUs"):
        assert "| measured: " in rows[name], rows[name]
    assert "| scaling-h200x4.json | 38.60 | 4 | 40.55 |" in out
    assert "| 16 nodes x 8 | 128 |" in out


def test_a_missing_phase_time_is_one_error_line(sm: ModuleType, capsys) -> None:
    assert sm.main(["--scaling", str(SCALING_X4)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and "--backward-fraction" in err[0]


def test_a_16_bit_zero1_run_gathers_half_the_bytes(sm: ModuleType, tmp_path: Path) -> None:
    """--gather-bytes 2 (a bf16 run's ZeRO-1 gathers its compute copy): the all-gather's
    bytes halve, and the inputs table says where the figure came from."""
    step = tmp_path / "step.json"
    step.write_text(json.dumps({"step_ms": 20.0, "tokens_per_step": 1000, "backward_ms": 12.0,
                                "optimizer_ms": 1.0, "model": {
                                    "layers": 1, "heads": 2, "embed": 32, "seq_len": 16,
                                    "batch": 2, "vocab": 50}}))
    wide, narrow = (sm.step_json_inputs(str(step), sm.parse_args(
        ["--step", str(step), "--gather-bytes", b])) for b in ("4", "2"))
    assert wide.param_bytes == 2 * narrow.param_bytes > 0
    assert narrow.labels["param_bytes"].startswith("2 bytes a parameter")
    net = sm.Network({2: sm.Link(0.0, 100.0)}, 400.0, 0.01)
    assert (sm.predict(wide, net, 2, zero1=True).comm_ms
            > sm.predict(narrow, net, 2, zero1=True).comm_ms)


def test_validation_takes_the_runs_of_the_modelled_setting(sm: ModuleType,
                                                           tmp_path: Path) -> None:
    """One log with the 1-GPU run, plain data parallel (float32 reduce) and ZeRO-1 with the
    bf16 wire on 2 GPUs (session 29's runs): each validation takes only its own setting's
    row, at that run's step time."""
    runs = REPO / "benchmarks" / "results" / "runs" / "session29-gpu" / "h200x4-final"
    log = tmp_path / "medium.log"
    log.write_text("".join((runs / f"medium-{n}.log").read_text()
                           for n in ("gpus1", "gpus2-fp32", "gpus2-zerobf16")))
    shape, tokens = "L12 H12 E768 T512 B16 V33278", 16 * 512
    base, plain = sm.measured_rows(str(log), "medium", shape, tokens, "fp32", zero1=False)
    _, zero = sm.measured_rows(str(log), "medium", shape, tokens, "bf16", zero1=True)
    assert base == pytest.approx(tokens / 557_492 * 1e3, rel=1e-3)  # the record's tok/s
    assert [n for n, _ in plain] == [n for n, _ in zero] == [2]
    assert plain[0][1] == pytest.approx(2 * tokens / 1_018_275 * 1e3, rel=1e-3)
    assert zero[0][1] == pytest.approx(2 * tokens / 1_063_029 * 1e3, rel=1e-3)
    assert sm.measured_rows(str(log), "medium", shape, tokens, "bf16", zero1=False)[1] == []
