"""`report` fits the terminal: on a terminal of N columns (rendered by the terminal emulator)
no line wraps, since wide tables fold their columns and long lines wrap at spaces; piped
output folds to COLUMNS when set and keeps whole lines otherwise (for grep and files)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import subprocess_env

from rustyflow_py.reporting.text import fold, table

pytest.importorskip("pyte", reason="the dev extra's pyte renders the terminal")

from screen import content, on_screen  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "benchmarks" / "results" / "runs"
# a CPU epoch, a GPU graph profile (long kernel names) and a quality run: 150-300 wide today
LOGS = [RUNS / name for name in ("seed-epoch-cpu-amd-epyc-2core.log",
                                 "h100-seed-graph-profile.log", "quality-h100.log")]
REPORT = [sys.executable, "-m", "rustyflow_py", "report",
          *(arg for log in LOGS for arg in ("--log", str(log)))]


def piped(**env: str) -> list[str]:
    out = subprocess.run(REPORT, capture_output=True, text=True, check=True, timeout=120,
                         env=subprocess_env(**env)).stdout
    return out.splitlines()


@pytest.mark.parametrize("cols", [100, 72])
def test_report_on_a_terminal_wraps_no_line(tmp_path: Path, cols: int) -> None:
    """What the screen shows is exactly the report's own lines: a line wider than the
    terminal would have been wrapped by the terminal into two screen rows."""
    screen, status = on_screen(REPORT, tmp_path, cols=cols, rows=1000)
    assert status == 0, "\n".join(screen)
    shown = content(screen)
    assert shown == content([line.rstrip() for line in piped(COLUMNS=str(cols))])
    assert shown[0].startswith("Runs (") and any(line.startswith("Timestamp ") for line in shown)


def test_piped_report_keeps_whole_lines_unless_columns_is_set() -> None:
    whole = piped()
    assert max(map(len, whole)) > 150  # the runs table and the block's first line
    assert max(map(len, piped(COLUMNS="100"))) <= 100


def test_a_folded_table_keeps_every_cell_and_repeats_the_key_column() -> None:
    headers = ["Timestamp", "Hardware", "Dataset", "Tok/s", "Val ppl"]
    rows = [["2026-11-25T01:35:44Z", "Intel(R) Xeon(R) Processor", "wikitext-2", "5,784",
             "1076.29"], ["2026-11-25T01:40:00Z", "NVIDIA H100 80GB HBM3", "tiny.txt",
                          "750,362", "308.20"]]
    whole = table(headers, rows, {3, 4})
    assert len(whole[0]) > 60 and len(whole) == 4
    folded = table(headers, rows, {3, 4}, width=60)
    assert max(map(len, folded)) <= 60 and len(folded) > len(whole)
    assert sum(line.startswith("Timestamp") for line in folded) >= 2
    for row in rows:
        for cell in row:
            assert any(cell in line for line in folded), cell
    assert table(headers, rows, {3, 4}, width=200) == whole


def test_a_column_wider_than_the_terminal_wraps_its_cells() -> None:
    rows = [["run", "a dataset path " * 8]]
    folded = table(["Key", "Dataset"], rows, set(), width=40)
    assert max(map(len, folded)) <= 40
    assert " ".join(" ".join(line.split()[1:]) if line.startswith("run") else line.strip()
                    for line in folded[2:]).split() == rows[0][1].split()


def test_fold_indents_continuations_and_keeps_short_lines() -> None:
    assert fold("short", 10) == ["short"]
    lines = fold("  Roofline line with several words in it", 20)
    assert lines[0].startswith("  Roofline") and all(len(x) <= 20 for x in lines)
    assert all(x.startswith("    ") for x in lines[1:])
