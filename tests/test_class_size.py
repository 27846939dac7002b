"""No class in the package is over 250 lines: a class that long does several jobs, and the
next change to one of them means reading all of them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rustyflow_py"
MAX_LINES = 250


def class_lengths() -> dict[str, int]:
    """`path::Class` -> lines from its `class` line to its last, for every class (nested
    ones included) in the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                key = f"{path.relative_to(PACKAGE).as_posix()}::{node.name}"
                out[key] = node.end_lineno - node.lineno + 1
    return out


def test_no_class_over_250_lines() -> None:
    lengths = class_lengths()
    assert len(lengths) > 50  # the walk saw the package, not an empty folder
    too_long = {k: n for k, n in lengths.items() if n > MAX_LINES}
    assert too_long == {}, f"split these by responsibility (lines): {too_long}"
