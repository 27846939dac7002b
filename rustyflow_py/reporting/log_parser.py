"""Reading a log back: the run records of its blocks, in file order.

A block starts at its summary line and ends at ``=== end of run ===`` (or at the next block, or
the end of the file, when a run was cut short); only its ``[RUN_JSON]`` line is read. Text
outside blocks is skipped, and a block without a readable record is skipped with a warning.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import command
from .record_schema import BLOCK_END, BLOCK_START, JSON_TAG, Record


def _blocks(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line number, summary line, body lines) of each block; text outside blocks is skipped."""
    start, head, body = 0, "", []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if line.startswith(BLOCK_START):
            if start:
                yield start, head, body
            start, head, body = number, line, []
        elif start and line == BLOCK_END:
            yield start, head, body
            start = 0
        elif start:
            body.append(line)
    if start:
        yield start, head, body


def parse_log(text: str, warnings: list[str] | None = None) -> list[Record]:
    """Every run record in the log text, in file order, read from the ``[RUN_JSON]`` lines.

    A block whose JSON line is missing or incomplete (a truncated last block, a hand edit) is
    skipped, and a line saying so is appended to ``warnings`` when a list is given. Unknown
    fields and newer record versions are kept as they are.
    """
    records: list[Record] = []
    for number, head, body in _blocks(text):
        where = f"line {number} ({head[:60]}...)"
        payload = next((ln[len(JSON_TAG) :] for ln in body if ln.startswith(JSON_TAG)), None)
        if payload is None:
            problem = f"{where}: no {JSON_TAG} line (truncated or edited); block skipped"
        else:
            try:
                record = json.loads(payload)
            except ValueError as exc:
                problem = f"{where}: {JSON_TAG} is not valid JSON ({exc}); block skipped"
            else:
                if isinstance(record, dict):
                    records.append(record)
                    continue
                problem = f"{where}: {JSON_TAG} is not an object; block skipped"
        if warnings is not None:
            warnings.append(problem)
    return records


def read_log(path: str | Path, warnings: list[str] | None = None) -> list[Record]:
    """The records of the log file at ``path`` (see :func:`parse_log`)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"training_log.txt not found at {p}: run `{command()} train` first (or pass --log FILE)"
        )
    return parse_log(p.read_text(encoding="utf-8", errors="replace"), warnings)
