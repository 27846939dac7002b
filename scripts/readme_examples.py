#!/usr/bin/env python3
"""Regenerate the example output blocks of README.md and docs/log-format.md from real runs.

    .venv/bin/python scripts/readme_examples.py      (needs the dev extra: pyte; WikiText-2)

- README's quick start: the final terminal screen of `./train_cpu.sh configs/quick.env`, run
  on a pseudo-terminal and rendered by a terminal emulator, exactly what a person sees;
- README's GPU profile: the report of a real H100 run (its committed log block), rendered by
  today's report code;
- docs/log-format.md: the log block of a two-epoch run of a tiny model on a small text file;
- docs/benchmarks.md's seed epoch: the committed CPU and GPU epoch logs as `report` renders
  them today, so the figures the page quotes are the files' own.

Each block sits between `<!-- example: NAME -->` and `<!-- end example -->` lines and is
replaced whole. tests/test_readme.py checks that both still have the current output's form.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from screen import content, on_screen  # noqa: E402  (the tests' terminal emulator)

README_COLS = 100
# The log example's run: two epochs of a one-layer model on a small generated text.
TINY_LOG_RUN = ["train", "--device", "cpu", "--dataset", "tiny.txt", "--num-epochs", "2",
                "--batch-size", "4", "--seq-len", "16", "--embed-dim", "32", "--num-heads", "2",
                "--num-layers", "1", "--log-interval", "10"]


def tiny_text() -> str:
    """A small deterministic text: 3,000 tokens of a 40-word vocabulary."""
    words = [f"w{i}" for i in range(40)]
    return "\n".join(" ".join(words[(7 * i + 3 * j) % 40] for j in range(10))
                     for i in range(300)) + "\n"


def put(path: Path, name: str, block: list[str]) -> None:
    """Replace the lines between the `name` example markers of `path` by a text block."""
    text = path.read_text()
    start, end = f"<!-- example: {name} -->\n", "<!-- end example -->"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    body = "```text\n" + "\n".join(block) + "\n```\n"
    path.write_text(head + start + body + end + tail)
    print(f"wrote the {name!r} example into {path.relative_to(ROOT)} ({len(block)} lines)")


def quick_start() -> list[str]:
    """The final screen of the README's first command."""
    screen, status = on_screen([str(ROOT / "train_cpu.sh"), "configs/quick.env"], ROOT,
                               cols=README_COLS, rows=200)
    if status != 0:
        sys.exit("Error: ./train_cpu.sh configs/quick.env failed:\n" + "\n".join(screen))
    return [line for line in content(screen)  # not the one-time set-up and compile lines
            if not line.startswith(("numba ", "bootstrap: ", "WARNING: "))]


GPU_LOG = ROOT / "benchmarks" / "results" / "runs" / "h100-seed-graph-profile.log"


def gpu_profile() -> list[str]:
    """The profile of a real H100 run (the committed seed epoch), as the report renders it
    today: the console summary's top ops and shares, the replayed step's check, the top ops'
    kernels and the roofline."""
    sys.path.insert(0, str(ROOT))
    from rustyflow_py.reporting import profile_text
    from rustyflow_py.reporting.log_parser import read_log
    from rustyflow_py.reporting.run_text import format_summary

    record = read_log(GPU_LOG)[-1]
    summary = format_summary(record, None).splitlines()
    lines = [line for line in summary[2:] if not line.startswith(("Checkpoint:", "Full report:"))]
    lines += profile_text.graph_lines(record["profile"], record.get("train_time_s"))
    lines += profile_text.kernel_lines(record, top_ops=3, per_op=3)
    return lines + profile_text.roofline_lines(record, top=5)


SEED_LOGS = [ROOT / "benchmarks" / "results" / "runs" / name
             for name in ("seed-epoch-h100.log", "seed-epoch-cpu-amd-epyc-2core.log")]


def seed_epoch() -> list[str]:
    """`report --log` over the committed seed-epoch logs: its runs table and the CPU-vs-GPU
    speed-up, then the CPU epoch's matmul floor line from its block."""
    sys.path.insert(0, str(ROOT))
    from rustyflow_py.reporting.log_parser import read_log
    from rustyflow_py.reporting.log_writer import format_block
    from rustyflow_py.reporting.report_page import render_report

    records = sorted((r for log in SEED_LOGS for r in read_log(log)),
                     key=lambda r: str(r.get("timestamp", "")))
    runs, speedup = render_report(records).split("\n\n")[:2]
    cpu = next(r for r in records if r.get("device") == "cpu")
    floor = [line for line in format_block(cpu).splitlines() if line.startswith("Matmul floor")]
    return [*runs.splitlines(), "", *speedup.splitlines(), "", *floor]


def log_block() -> list[str]:
    """The log block of the tiny run, its one-line [RUN_JSON] shortened."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tiny.txt").write_text(tiny_text())
        subprocess.run([sys.executable, "-m", "rustyflow_py", *TINY_LOG_RUN], cwd=tmp,
                       check=True, capture_output=True)
        lines = (Path(tmp) / "training_log.txt").read_text().splitlines()
    return [re.sub(r"^(\[RUN_JSON\] .{120}).*", r"\1 ... (one line; shortened here)", line)
            for line in lines]


if __name__ == "__main__":
    put(ROOT / "README.md", "gpu profile", gpu_profile())
    put(ROOT / "docs" / "log-format.md", "log block", log_block())
    put(ROOT / "docs" / "benchmarks.md", "seed epoch", seed_epoch())
    put(ROOT / "README.md", "quick start", quick_start())
