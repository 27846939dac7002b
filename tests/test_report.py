"""The run block, the log parser and `rustyflow report`, on synthetic run records."""

from __future__ import annotations

import json

import numpy as np
import pytest
from report_records import CPU_OPS, cpu_record, dp_record, gpu_record, interrupted_record, parallel

from rustyflow_py.errors import command
from rustyflow_py.reporting.analysis import scaling, speedups
from rustyflow_py.reporting.log_parser import parse_log, read_log
from rustyflow_py.reporting.log_writer import format_block
from rustyflow_py.reporting.logfile import append_block
from rustyflow_py.reporting.report_page import render_report
from rustyflow_py.reporting.run_text import format_summary


def lines_of(block: str) -> list[str]:
    return block.rstrip("\n").split("\n")


def index_of(lines: list[str], prefix: str) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith(prefix))


def test_cpu_block_lines_in_order_with_computed_numbers() -> None:
    record = cpu_record()
    lines = lines_of(format_block(record))
    window = record["profile"]["profiled_time_s"]
    matmul = sum(op["time_s"] for op in CPU_OPS if op["category"] == "matmul")
    p = matmul / window

    assert lines[0] == (
        "=== RustyFlow run 2026-11-22T07:00:00Z | completed | device=cpu (requested cpu) | "
        "AMD EPYC 9654 96-Core Processor | wikitext-2 | L2 H4 E128 T64 B16 V33278 "
        "(4,657,408 params) | fp32 | epochs 2/2 | avg epoch 1.875s | 21,000 tok/s | "
        "val ppl 412.35 | test ppl 398.10 | ckpt models/wikitext-2-L2-H4-E128-cpu.npz ==="
    )
    assert (
        "Total training time: 4.250s | average epoch time: 1.875s | tokens/s: 21,000 | "
        "steps: 300" in lines
    )
    assert (
        f"Total matmul time (CPU + GPU): {matmul:.3f}s ({100 * p:.1f}% of the {window:.3f}s "
        "of profiled training steps)" in lines
    )
    other = next(line for line in lines if line.startswith("Other time ("))
    assert other.endswith(f"): {window - matmul:.3f}s ({100 * (1 - p):.1f}% of the same)")
    amdahl = (
        f"Amdahl's bound: {1 / (1 - p):.2f}x max speed-up from faster matmuls alone (p={p:.3f})"
    )
    assert amdahl in lines
    assert not any(line.startswith("Per-op numbers and shares come from") for line in lines)
    assert "Memory: peak process RSS 1.5 GiB" in lines
    assert (
        "Matmul floor: 4.600 ms/step at 410.5 GFLOP/s measured GEMM rate vs 11.500 ms/step "
        "real (2.50x the floor)" in lines
    )
    order = [
        index_of(lines, "=== RustyFlow run "),
        index_of(lines, "Total training time:"),
        index_of(lines, "Op "),
        index_of(lines, "Total matmul time (CPU + GPU):"),
        index_of(lines, "Other time ("),
        index_of(lines, "Amdahl's bound:"),
        index_of(lines, "Phase split"),
        index_of(lines, "Host<->device traffic per step:"),
        index_of(lines, "Memory:"),
        index_of(lines, "Matmul floor:"),
        index_of(lines, "[AVG_EPOCH_TIME] "),
        index_of(lines, "[RUN_JSON] "),
    ]
    assert order == sorted(order)
    assert lines[-3:-1] == [lines[order[-2]], lines[order[-1]]]
    assert lines[-3] == "[AVG_EPOCH_TIME] 1.875000"
    assert lines[-1] == "=== end of run ==="


def test_op_table_is_sorted_by_time_with_shares_of_the_window() -> None:
    lines = lines_of(format_block(cpu_record()))
    start = index_of(lines, "Op ")
    assert lines[start].split() == [
        "Op",
        "Phase",
        "Category",
        "Calls",
        "Total",
        "s",
        "ms/call",
        "Share",
        "%",
    ]
    rows = [line.split() for line in lines[start + 2 : start + 2 + len(CPU_OPS)]]
    times = [float(row[4]) for row in rows]
    assert times == sorted((op["time_s"] for op in CPU_OPS), reverse=True)
    backward = rows[0]
    assert backward[:4] == ["matmul", "backward", "matmul", "8,400"]
    assert backward[5] == f"{1.9e3 / 8400:.3f}"
    assert backward[6] == f"{100 * 1.9 / 3.5:.1f}"
    total = lines[start + 2 + len(CPU_OPS)].split()
    assert total[:2] == ["all", "ops"]
    assert total[-1] == f"{100 * sum(op['time_s'] for op in CPU_OPS) / 3.5:.1f}"


def test_gpu_partial_window_block() -> None:
    record = gpu_record()
    prof = record["profile"]
    lines = lines_of(format_block(record))
    matmul = sum(op["time_s"] for op in prof["ops"] if op["category"] == "matmul")
    p = matmul / prof["profiled_time_s"]

    assert lines[0].startswith(
        "=== RustyFlow run 2026-11-22T08:00:00Z | completed | "
        "device=gpu (requested auto) | NVIDIA H100 80GB HBM3 |"
    )
    assert "| tf32 |" in lines[0] and "| 252,000 tok/s |" in lines[0]
    assert "CUDA graph replay: yes" in lines[1]
    window = prof["profiled_time_s"]
    assert (
        f"Total matmul time (CPU + GPU): {matmul:.3f}s ({100 * p:.1f}% of the {window:.3f}s "
        "of profiled training steps on the device)" in lines
    )
    amdahl = index_of(lines, "Amdahl's bound:")
    assert lines[amdahl].startswith(f"Amdahl's bound: {1 / (1 - p):.2f}x ")
    partial = lines[amdahl + 1]
    assert partial.startswith(
        "Per-op numbers and shares come from the profiled window "
        "(20 of 300 steps, 0.080s), not the whole run: "
    )
    assert partial.endswith(prof["note"])
    assert (
        "GPU host vs device: host launching 0.025s, device busy 0.066s (82.5% of the 0.080s "
        "window)" in lines
    )
    assert (
        "Host<->device traffic per step: H2D 1.00 copies (8.0 KiB), D2H 0.10 copies "
        "(0.4 B)" in lines
    )
    assert (
        "Host<->device traffic over 300 steps: H2D 300 copies (2.3 MiB), D2H 30 copies "
        "(120 B)" in lines
    )
    assert "Memory: peak GPU pool used 1.5 GiB of 2.0 GiB pool total" in lines
    assert not any(line.startswith("Matmul floor:") for line in lines)
    assert "[AVG_EPOCH_TIME] 0.160000" in lines


def test_phase_split_shares() -> None:
    lines = lines_of(format_block(cpu_record()))
    rows = {
        line.split()[0]: line.split()
        for line in lines[index_of(lines, "Phase split") + 3 :]
        if line.split() and line.split()[0] in ("forward", "backward", "eval")
    }
    assert rows["forward"][1:3] == ["1.400", f"{100 * 1.4 / 3.5:.1f}"]
    assert rows["backward"][1:3] == ["1.800", f"{100 * 1.8 / 3.5:.1f}"]
    assert rows["eval"][1:3] == ["0.750", f"{100 * 0.75 / 4.25:.1f}"]


def test_fallback_and_interrupted_block_without_profile() -> None:
    record = interrupted_record()
    block = format_block(record)
    lines = lines_of(block)
    expected = (2.0 - 0.0) / 40 * 150  # no eval phase recorded: all the time was steps

    assert lines[0].startswith(
        "=== RustyFlow run 2026-11-22T09:00:00Z | interrupted | "
        "device=cpu (requested gpu, fell back: no CUDA driver) |"
    )
    assert f"| avg epoch {expected:.3f}s (extrapolated) |" in lines[0]
    assert "| val ppl n/a | test ppl n/a | ckpt n/a ===" in lines[0]
    assert "Message: KeyboardInterrupt at step 40" in lines
    assert any(line.startswith("Profile: none") for line in lines)
    avg = index_of(lines, "[AVG_EPOCH_TIME] ")
    assert lines[avg] == f"[AVG_EPOCH_TIME] {expected:.6f}"
    assert lines[avg - 1].startswith("Average epoch time is an estimate (interrupted, 0/2 epochs")
    assert parse_log(block) == [record]


def test_no_epoch_and_nothing_to_extrapolate_leaves_the_avg_line_out() -> None:
    record = interrupted_record(steps=0, steps_per_epoch=None, status="failed")
    lines = lines_of(format_block(record))
    assert "| avg epoch n/a |" in lines[0]
    assert not any(line.startswith("[AVG_EPOCH_TIME]") for line in lines)
    assert any(line.startswith("Average epoch time: not available (failed") for line in lines)


def test_round_trip_of_all_three_records() -> None:
    records = [cpu_record(), gpu_record(), interrupted_record()]
    text = "".join(format_block(r) for r in records)
    warnings: list[str] = []
    assert parse_log(text, warnings) == records
    assert warnings == []


def test_json_line_is_strict_and_free_text_cannot_forge_lines() -> None:
    record = cpu_record(
        final_loss=float("nan"),
        tokens_per_s=np.float32(1234.5),
        steps=np.int64(300),
        message="boom\n=== RustyFlow run fake\n[RUN_JSON] {}\u2028=== end of run ===",
    )
    block = format_block(record)
    json_line = next(line for line in lines_of(block) if line.startswith("[RUN_JSON] "))

    def reject(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    data = json.loads(json_line[len("[RUN_JSON] ") :], parse_constant=reject)
    assert data["final_loss"] is None and data["tokens_per_s"] == 1234.5 and data["steps"] == 300
    assert "| tokens/s: 1,234 | steps: 300" in block and "final loss nan" in block
    assert sum(line.startswith("=== RustyFlow run ") for line in lines_of(block)) == 1
    assert parse_log(block) == [data]
    assert parse_log(block)[0]["message"] == record["message"]


def test_empty_record_still_renders() -> None:
    block = format_block({})
    assert block.startswith("=== RustyFlow run n/a | n/a | device=n/a (requested n/a) |")
    assert parse_log(block) == [{}]


def test_several_blocks_with_garbage_and_a_truncated_last_block() -> None:
    future = cpu_record(version=2, timestamp="2027-01-01T00:00:00Z", new_field={"x": [1, 2]})
    good = [cpu_record(), gpu_record(), future]
    truncated = format_block(interrupted_record())
    cut = truncated[: truncated.index("[RUN_JSON] ") + 200]
    no_end = format_block(gpu_record(timestamp="2026-11-22T10:00:00Z")).replace(
        "=== end of run ===\n", ""
    )
    text = (
        "hand-written note at the top\n\n"
        + format_block(good[0])
        + 'random garbage === between blocks\n[RUN_JSON] {"orphan": true}\n'
        + format_block(good[1]).replace("\n", "\r\n")
        + no_end
        + "\n\n"
        + format_block(good[2])
        + "=== RustyFlow run 2026-11-22T11:00:00Z | completed | header only\n"
        + "some report lines\n"
        + cut
    )
    warnings: list[str] = []
    records = parse_log(text, warnings)
    timestamps = [r["timestamp"] for r in records]
    assert timestamps == [
        "2026-11-22T07:00:00Z",
        "2026-11-22T08:00:00Z",
        "2026-11-22T10:00:00Z",
        "2027-01-01T00:00:00Z",
    ]
    assert records[0] == good[0] and records[1] == good[1] and records[3] == future
    assert len(warnings) == 2
    assert "no [RUN_JSON] line" in warnings[0] and "2026-11-22T11:00:00Z" in warnings[0]
    assert "not valid JSON" in warnings[1] and "2026-11-22T09:00:00Z" in warnings[1]
    assert parse_log(text) == records  # warnings are optional


def test_read_log(tmp_path) -> None:
    missing = tmp_path / "training_log.txt"
    with pytest.raises(FileNotFoundError) as info:
        read_log(missing)
    assert str(info.value) == (
        f"training_log.txt not found at {missing}: run `{command()} train` first "
        "(or pass --log FILE)"
    )
    append_block(missing, format_block(cpu_record()))
    append_block(missing, format_block(gpu_record()))
    assert read_log(missing) == [cpu_record(), gpu_record()]


def runs_for_speedup() -> list[dict]:
    older_cpu = cpu_record(timestamp="2026-11-21T00:00:00Z", avg_epoch_time_s=500.0)
    cpu = cpu_record(timestamp="2026-11-22T01:00:00Z", avg_epoch_time_s=100.0, tokens_per_s=21000.0)
    gpu = gpu_record(timestamp="2026-11-22T02:00:00Z", avg_epoch_time_s=8.0, tokens_per_s=252000.0)
    gpu_interrupted = gpu_record(
        timestamp="2026-11-22T03:00:00Z", status="interrupted", avg_epoch_time_s=1.0
    )
    other_shape = gpu_record(
        timestamp="2026-11-22T04:00:00Z", model=dict(cpu["model"], embed=256), avg_epoch_time_s=3.0
    )
    return [older_cpu, cpu, gpu, gpu_interrupted, other_shape]


def test_speedup_pairs_latest_completed_runs_of_the_same_shape() -> None:
    doc = json.loads(render_report(runs_for_speedup(), fmt="json"))
    assert [r["timestamp"] for r in doc["runs"]] == [r["timestamp"] for r in runs_for_speedup()]
    assert len(doc["speedups"]) == 1
    pair = doc["speedups"][0]
    assert pair["shape"] == "L2 H4 E128 T64 B16 V33278" and pair["dataset"] == "wikitext-2"
    assert (pair["cpu_run"], pair["gpu_run"]) == ("2026-11-22T01:00:00Z", "2026-11-22T02:00:00Z")
    assert pair["epoch_speedup"] == pytest.approx(100.0 / 8.0)
    assert pair["tokens_per_s_ratio"] == pytest.approx(252000.0 / 21000.0)
    assert doc["latest"]["timestamp"] == "2026-11-22T04:00:00Z"


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_text_report_has_runs_speedup_and_latest_report(fmt: str) -> None:
    records = runs_for_speedup()
    out = render_report(records, fmt=fmt)
    for r in records:
        assert r["timestamp"] in out
    speedup_lines = [line for line in out.split("\n") if "12.50x" in line]
    assert len(speedup_lines) == 1 and "12.00x" in speedup_lines[0]
    assert "L2 H4 E256 T64 B16 V33278" in out
    assert "Amdahl's bound:" in out and "[AVG_EPOCH_TIME] 3.000000" in out
    assert "[RUN_JSON]" not in out
    if fmt == "markdown":
        assert "| Timestamp | Status | Device |" in out
        assert "|---|---|---|" in out and "```text" in out
        rows = [line for line in out.split("\n") if line.startswith("| 2026-11-2")]
        assert len(rows) == len(records)
    else:
        assert "|" not in out.split("\n")[1]


@pytest.mark.parametrize("fmt", ["table", "markdown", "json"])
def test_no_speedup_for_different_shapes(fmt: str) -> None:
    records = [cpu_record(), gpu_record(model=dict(cpu_record()["model"], seq_len=128))]
    out = render_report(records, fmt=fmt)
    if fmt == "json":
        assert json.loads(out)["speedups"] == []
    else:
        assert "none: needs a completed CPU run and a completed GPU run" in out
        assert not any(
            line.rstrip().endswith("x")
            for line in out.split("\n")
            if line.startswith("wikitext-2") or line.startswith("| wikitext-2")
        )


def test_last_and_latest_profiled_run() -> None:
    records = [cpu_record(), gpu_record(), interrupted_record()]
    out = render_report(records, fmt="table", last=2)
    assert "Runs (2)" in out and "2026-11-22T07:00:00Z" not in out
    assert "Latest profiling report: run 2026-11-22T08:00:00Z" in out  # the last run has none
    assert "cpu (req gpu)" in out and "~7.500" in out and "~ estimated" in out
    doc = json.loads(render_report([interrupted_record()], fmt="json"))
    assert doc["latest"]["timestamp"] == "2026-11-22T09:00:00Z"
    with pytest.raises(ValueError):
        render_report(records, last=0)


def test_empty_log_report() -> None:
    assert "No runs in the log." in render_report([])
    assert json.loads(render_report([], fmt="json")) == {"runs": [], "speedups": [], "latest": None}
    assert "No runs in the log." in render_report([], fmt="markdown")


# ---------------------------------------------------------------- data parallelism


def test_data_parallel_block_lines() -> None:
    record = dp_record(parallel=parallel(2, tokens_per_s_per_rank=406172.4, buckets=3,
                                         bucket_mb=12.5))
    lines = lines_of(format_block(record))
    p, batch = record["parallel"], record["model"]["batch"]

    assert "| 812,345 tok/s (total of 2 processes) |" in lines[0]
    totals = lines[index_of(lines, "Total training time:")]
    assert "| tokens/s: 812,345 (total of 2 processes) | steps: 300" in totals
    dp = lines[index_of(lines, "Data parallel:")]
    assert dp == (
        f"Data parallel: 2 processes (rustyflow launcher) x BATCH_SIZE {batch} x "
        f"GRAD_ACCUM_STEPS 1 = effective batch {p['effective_batch']} streams; ZeRO-1 optimizer "
        "sharding off; 3 gradient buckets of <= 12.5 MiB; gradient summed in fp32"
    )
    assert lines[index_of(lines, "Data parallel:") + 1] == (
        "Tokens/s: 812,345 total, 406,172 per process"
    )
    assert index_of(lines, "Total training time:") < index_of(lines, "Data parallel:")
    assert index_of(lines, "Tokens/s:") < index_of(lines, "Per-op profile")
    zero = parallel(4, launcher="torchrun", grad_accum_steps=2, effective_batch=128,
                    shard_optimizer=True, buckets=0,  # reduce-scatter: no all-reduce buckets
                    grad_reduce_dtype="bf16")
    lines = lines_of(format_block(dp_record(4, parallel=zero)))
    assert lines[index_of(lines, "Data parallel:")] == (
        "Data parallel: 4 processes (torchrun launcher) x BATCH_SIZE 16 x GRAD_ACCUM_STEPS 2 = "
        "effective batch 128 streams; ZeRO-1 optimizer sharding on; gradient summed in bf16"
    )
    assert "Tokens/s: 812,345 total, n/a per process" in lines


def test_gradient_accumulation_alone_gets_its_own_line() -> None:
    record = gpu_record(parallel=parallel(1, grad_accum_steps=4, effective_batch=64))
    lines = lines_of(format_block(record))
    assert (
        "Gradient accumulation: 1 process x BATCH_SIZE 16 x GRAD_ACCUM_STEPS 4 = effective "
        "batch 64 streams" in lines
    )
    assert not any(line.startswith(("Data parallel:", "Tokens/s:")) for line in lines)
    assert "(total of" not in lines[0]


@pytest.mark.parametrize("value", [parallel(1), None])
def test_one_process_record_renders_like_an_old_one(value: object) -> None:
    def human(record: dict) -> list[str]:
        return [line for line in lines_of(format_block(record)) if not line.startswith("[RUN_")]

    assert human(gpu_record(parallel=value)) == human(gpu_record())
    assert render_report([gpu_record(parallel=value)]) == render_report([gpu_record()])


def test_comm_line_and_other_excludes_comm() -> None:
    record = dp_record()
    prof = record["profile"]
    lines = lines_of(format_block(record))
    window = prof["profiled_time_s"]
    matmul = sum(op["time_s"] for op in prof["ops"] if op["category"] == "matmul")
    comm = sum(op["time_s"] for op in prof["ops"] if op["category"] == "comm")
    p = matmul / window

    comm_line = lines[index_of(lines, "Communication time (")]
    assert comm_line == (
        "Communication time (NCCL collectives, measured on the step's stream in the profiled "
        "steps; they overlap backward in replayed steps): "
        f"{comm:.3f}s ({100 * comm / window:.1f}% of the same)"
    )
    other = lines[index_of(lines, "Other time (")]
    assert "communication and eval excluded" in other
    assert other.endswith(
        f"): {window - matmul - comm:.3f}s ({100 * (window - matmul - comm) / window:.1f}% of "
        "the same)"
    )
    assert f"Amdahl's bound: {1 / (1 - p):.2f}x max speed-up from faster matmuls alone " in (
        lines[index_of(lines, "Amdahl's bound:")]
    )
    order = [index_of(lines, prefix) for prefix in (
        "Total matmul time", "Communication time (", "Other time (", "Amdahl's bound:")]
    assert order == list(range(order[0], order[0] + 4))


def test_cpu_comm_line_names_the_socket_transport() -> None:
    record = cpu_record(parallel=parallel(2))
    record["profile"]["ops"].append(
        {"name": "all_reduce", "category": "comm", "phase": "backward", "calls": 300,
         "time_s": 0.3}
    )
    lines = lines_of(format_block(record))
    comm = lines[index_of(lines, "Communication time (")]
    assert "sockets" in comm and "NCCL" not in comm and comm.endswith(
        f"0.300s ({100 * 0.3 / 3.5:.1f}% of the same)")
    other = lines[index_of(lines, "Other time (")]
    assert f": {3.5 - 2.6 - 0.3:.3f}s " in other


def test_summary_names_the_processes() -> None:
    record = dp_record()
    lines = format_summary(record, "training_log.txt").split("\n")
    assert lines[1] == (
        "Data parallel: 2 processes, 812,345 tok/s total (406,172 per process), effective batch 32"
    )
    assert any(line.startswith("Communication time (NCCL collectives") for line in lines)
    single = format_summary(gpu_record(), "training_log.txt")
    assert "Data parallel:" not in single and "Communication time" not in single


def test_round_trip_keeps_parallel() -> None:
    record = dp_record()
    block = format_block(record)
    assert parse_log(block) == [record]
    assert parse_log(block)[0]["parallel"] == record["parallel"]


def runs_for_scaling() -> list[dict]:
    model = cpu_record()["model"]
    return [
        gpu_record(timestamp="2026-11-23T00:00:00Z", tokens_per_s=50000.0),  # older 1-process
        gpu_record(timestamp="2026-11-23T01:00:00Z", tokens_per_s=100000.0, parallel=parallel(1)),
        dp_record(2, 190000.0, timestamp="2026-11-23T02:00:00Z"),
        dp_record(4, 360000.0, timestamp="2026-11-23T03:00:00Z"),
        dp_record(4, 999999.0, timestamp="2026-11-23T04:00:00Z", status="interrupted"),
        dp_record(2, 999999.0, timestamp="2026-11-23T05:00:00Z", precision="fp32"),
        dp_record(2, 999999.0, timestamp="2026-11-23T06:00:00Z",
                  model=dict(model, batch=32)),
        dp_record(8, None, timestamp="2026-11-23T07:00:00Z"),
        cpu_record(timestamp="2026-11-23T08:00:00Z", parallel=parallel(2)),
    ]


def test_scaling_pairs_each_process_count_with_one_process() -> None:
    found = scaling(runs_for_scaling())
    assert [(s["world_size"], s["run"]) for s in found] == [
        (2, "2026-11-23T02:00:00Z"),
        (4, "2026-11-23T03:00:00Z"),
    ]
    two, four = found
    assert {s["one_process_run"] for s in found} == {"2026-11-23T01:00:00Z"}
    assert (two["one_process_tokens_per_s"], two["tokens_per_s"]) == (100000.0, 190000.0)
    assert two["speedup"] == pytest.approx(1.9) and two["efficiency"] == pytest.approx(0.95)
    assert four["speedup"] == pytest.approx(3.6) and four["efficiency"] == pytest.approx(0.9)
    assert (two["dataset"], two["shape"], two["precision"]) == (
        "wikitext-2", "L2 H4 E128 T64 B16 V33278", "tf32")
    assert scaling([dp_record(2)]) == []  # no one-process run to compare with


def test_speedups_compare_one_process_runs_only() -> None:
    cpu = cpu_record(timestamp="2026-11-23T00:00:00Z")
    gpu = gpu_record(timestamp="2026-11-23T01:00:00Z")
    pairs = speedups([cpu, gpu, dp_record(2, timestamp="2026-11-23T02:00:00Z")])
    assert [p["gpu_run"] for p in pairs] == ["2026-11-23T01:00:00Z"]


def test_scaling_in_the_report() -> None:
    records = runs_for_scaling()
    doc = json.loads(render_report(records, fmt="json"))
    assert [(s["world_size"], s["speedup"]) for s in doc["scaling"]] == [
        (2, pytest.approx(1.9)),
        (4, pytest.approx(3.6)),
    ]
    for fmt in ("table", "markdown"):
        out = render_report(records, fmt=fmt)
        assert "Data-parallel scaling" in out
        rows = [line for line in out.split("\n") if "1.90x" in line]
        assert len(rows) == 1 and "95.0%" in rows[0] and "190,000" in rows[0]
        assert "100,000" in rows[0]
        assert any("3.60x" in line and "90.0%" in line for line in out.split("\n"))
    table = render_report(records, fmt="table")
    assert "gpu:0 x2" in table and "gpu:0 x4" in table


@pytest.mark.parametrize("fmt", ["table", "markdown", "json"])
def test_no_scaling_section_without_pairs(fmt: str) -> None:
    out = render_report([gpu_record(), dp_record(2, precision="fp32")], fmt=fmt)
    if fmt == "json":
        assert "scaling" not in json.loads(out)
    else:
        assert "Data-parallel scaling" not in out


def test_report_reads_every_log_it_is_given(tmp_path) -> None:
    """`report --log A --log B` reports both logs' runs together, in time order; a missing
    one is an error, never silently dropped."""
    from click.testing import CliRunner

    from rustyflow_py.cli import main

    cpu, gpu = tmp_path / "cpu.txt", tmp_path / "gpu.txt"
    append_block(gpu, format_block(gpu_record(timestamp="2026-01-02T00:00:00Z")))
    append_block(cpu, format_block(cpu_record(timestamp="2026-01-01T00:00:00Z")))
    result = CliRunner().invoke(main, ["report", "--log", str(gpu), "--log", str(cpu),
                                       "--format", "json"])
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)["runs"]
    assert [r["timestamp"] for r in runs] == ["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]
    result = CliRunner().invoke(main, ["report", "--log", str(cpu), "--log",
                                       str(tmp_path / "nope.txt")])
    assert result.exit_code == 1 and "nope.txt" in result.stderr


def test_a_floor_the_steps_beat_does_not_call_itself_a_floor() -> None:
    """Measured on a busy machine, the GEMM rate can put the 'floor' above the real step
    time: the line then says so instead of reporting '0.50x the floor'."""
    record = cpu_record()
    record["profile"]["matmul_floor"].update(floor_s_per_step=0.02, step_s=0.01)
    line = next(x for x in lines_of(format_block(record)) if x.startswith("Matmul floor:"))
    assert "0.50x: faster than this floor" in line and "no bound here" in line
    assert "x the floor" not in line
