"""The guarantees tables (README's "Faults and guarantees", docs/faults.md) name tests that
exist: every `test_file.py::test_name` node and every fault-matrix case they cite; and
docs/faults.md cites every case and test of the fault matrix, so the two match case for
case."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
DOCS = [ROOT / "README.md", ROOT / "docs" / "faults.md"]
NODE = re.compile(r"(?:tests/)?(test_\w+\.py)::(test_\w+)")


def held_by_cells(doc: Path) -> list[str]:
    """The last cell of every table row (the "Held by" column) in the doc's guarantee tables."""
    return [line.rstrip(" |").rsplit("|", 1)[-1] for line in doc.read_text().splitlines()
            if line.startswith("| ") and line.count("|") >= 3]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_cited_test_exists(doc: Path) -> None:
    cells = held_by_cells(doc)
    nodes = [m.groups() for cell in cells for m in NODE.finditer(cell)]
    assert nodes, f"{doc.name} cites no tests"
    missing = [f"{f}::{t}" for f, t in nodes
               if not (TESTS / f).is_file() or f"def {t}(" not in (TESTS / f).read_text()]
    assert missing == [], f"{doc.name} cites tests that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_cited_matrix_case_exists(doc: Path) -> None:
    matrix = (TESTS / "test_fault_matrix.py").read_text()
    cases = [name for cell in held_by_cells(doc) if "matrix" in cell
             for name in re.findall(r"`([a-z0-9][a-z0-9-]*)`", cell.split("matrix", 1)[1])]
    assert cases, f"{doc.name} cites no fault-matrix case"
    missing = [c for c in cases if f'"{c}"' not in matrix]
    assert missing == [], f"{doc.name} cites matrix cases that do not exist: {missing}"


def test_faults_doc_cites_every_matrix_case_and_test() -> None:
    matrix = (TESTS / "test_fault_matrix.py").read_text()
    cells = "\n".join(held_by_cells(ROOT / "docs" / "faults.md"))
    cases = re.findall(r'^\s+(?:Signal)?Case\("([a-z0-9-]+)"', matrix, re.M)
    tests = re.findall(r"^def (test_\w+)\(", matrix, re.M)
    assert cases and tests
    missing = [c for c in cases if f"`{c}`" not in cells and f"[{c}]" not in cells]
    missing += [t for t in tests if t not in cells]
    assert missing == [], f"docs/faults.md does not cite these fault-matrix cases: {missing}"
