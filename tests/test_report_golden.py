"""What the reporting code writes, byte for byte: the log block, the console summary and
`rustyflow report`, for the run logs committed in benchmarks/results/runs/ and for synthetic
records with the fields those logs lack (subword tokenizer, loss scaling, data parallelism,
an interrupted run).

test_report.py checks what each line means; this file catches any change at all, so a
refactor of the reporting modules can show it changed nothing. After an intended change of
the text, regenerate the golden file and review its diff:

    .venv/bin/python tests/test_report_golden.py
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_records import cpu_record, dp_record, gpu_record, interrupted_record, parallel

from rustyflow_py.cli import main
from rustyflow_py.errors import command
from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.reporting.log_writer import format_block
from rustyflow_py.reporting.record_schema import JSON_TAG
from rustyflow_py.reporting.report_page import render_report
from rustyflow_py.reporting.run_text import format_summary

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "benchmarks" / "results" / "runs"
GOLDEN = Path(__file__).resolve().parent / "golden" / "report.txt"
# The committed logs `rustyflow report` reads here (named: a log added later changes nothing).
LOGS = ("curves-cpu.log", "curves-h100.log", "dropout-throughput-h100.log",
        "h100-medium-bf16-graph-profile.log", "h100-seed-cold-cache.log",
        "h100-seed-eager-window.log", "h100-seed-graph-profile.log",
        "h100-seed-warm-cache.log", "profile-medium-bf16-h100.log",
        "quality-h100-attempt1.log", "quality-h100-attempt2.log", "quality-h100.log",
        "seed-epoch-cpu-amd-epyc-2core.log", "seed-epoch-h100-engine-shape.log",
        "seed-epoch-h100.log")
# One block of each kind: a CPU epoch with its matmul floor, a sampled CUDA-graph profile with
# kernels, roofline and start-up, an eager GPU window, and short runs without a profile.
BLOCKS = ("seed-epoch-cpu-amd-epyc-2core.log", "h100-seed-graph-profile.log",
          "h100-seed-eager-window.log", "dropout-throughput-h100.log")


def synthetic() -> dict[str, dict]:
    """Records with what the committed logs lack."""
    subword = {"kind": "bpe", "vocab": 8192, "sha256": "0123456789abcdef" * 4,
               "words": {"valid": 217646, "test": 245569}}
    return {
        "cpu": cpu_record(),
        "gpu eager window": gpu_record(),
        "interrupted after a fallback": interrupted_record(),
        "failed, nothing to extrapolate": interrupted_record(steps=0, steps_per_epoch=None,
                                                             status="failed"),
        "subword, evaluated on a subset": cpu_record(
            tokenizer=subword, val_ppl_word=301.25, test_ppl_word=288.5,
            eval_protocol="non-overlapping 64-token windows", best_val_ppl=410.0,
            best_step=200, best_checkpoint="models/a-cpu-best.npz", test_ppl_of="best (step 200)",
            eval_tokens={"valid": [20000, 217600], "test": [245504, 245504]},
            early_stopped=True),
        "fp16 loss scaling": gpu_record(precision="fp16",
                                        loss_scale={"scale": 16384.0, "skipped": 7}),
        "fp8 delayed scaling": gpu_record(
            precision="fp8", fp8_scaling="delayed", fp8_tensors=[
                {"tensor": "linear x", "format": "e4m3", "shape": [16384, 768],
                 "amax": 12.5, "scale": 35.84},
                {"tensor": "linear w", "format": "e4m3", "shape": [768, 2304], "amax": 0.875,
                 "scale": 512.0},
                {"tensor": "gelu gradient", "format": "e5m2", "shape": [16384, 3072],
                 "amax": 0.0009765625, "scale": 58720256.0}]),
        "4 processes, ZeRO-1": dp_record(4, parallel=parallel(
            4, shard_optimizer=True, buckets=0, tokens_per_s_per_rank=203086.25)),
        "2 CPU processes": cpu_record(parallel=parallel(2)),
        "gradient accumulation": gpu_record(
            parallel=parallel(1, grad_accum_steps=4, effective_batch=64)),
    }


def cli_report(*args: str) -> str:
    result = CliRunner().invoke(main, ["report", *args])
    assert result.exit_code == 0, result.output
    return result.output


def rendered() -> str:
    """Everything the golden file holds, in its order."""
    logs = [RUNS / name for name in LOGS]
    all_logs = [arg for log in logs for arg in ("--log", str(log))]
    parts = {
        "rustyflow report (the committed logs)": cli_report(*all_logs),
        "rustyflow report --format markdown --last 4": cli_report(
            *all_logs, "--format", "markdown", "--last", "4"),
    }
    records = {f"{name} #{i}": r for name in BLOCKS
               for i, r in enumerate(read_log(RUNS / name), start=1)}
    records.update(synthetic())
    for name, record in records.items():
        block = format_block(record)
        parts[f"block: {name}"] = "".join(line for line in block.splitlines(keepends=True)
                                          if not line.startswith(JSON_TAG))
        summary = format_summary(record, "training_log.txt") + "\n"
        # how to run rustyflow depends on the machine (errors.command)
        parts[f"summary: {name}"] = summary.replace(f"`{command()} report", "`rustyflow report")
    runs = list(synthetic().values())
    parts["report of the synthetic runs (table)"] = render_report(runs)
    parts["report of the synthetic runs (markdown)"] = render_report(runs, "markdown")
    # The JSON (each block's [RUN_JSON] line and `report --format json`) by digest: it is the
    # record itself, large, and unchanged by the text around it.
    every = [r for log in logs for r in read_log(log)] + runs
    json_text = "".join(format_block(r).split(JSON_TAG)[1] for r in every)
    json_text += cli_report(*all_logs, "--format", "json") + render_report(runs, "json")
    parts["sha256 of the JSON"] = hashlib.sha256(json_text.encode()).hexdigest() + "\n"
    return "".join(f"#### {title}\n{text}" for title, text in parts.items())


def test_reporting_output_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # whole lines, as piped output has them
    expected = GOLDEN.read_text(encoding="utf-8")
    actual = rendered()
    if actual != expected:  # name the first section that differs: the assert shows the rest
        sections = zip(actual.split("#### ")[1:], expected.split("#### ")[1:], strict=False)
        first = next((a.split("\n", 1)[0] for a, e in sections if a != e), "the section list")
        assert actual == expected, f"first difference in: {first}"


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(rendered(), encoding="utf-8")
    sys.stdout.write(f"wrote {GOLDEN}\n")
