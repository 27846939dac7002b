"""The README and docs/*.md check themselves: every relative link resolves (the file, and for
`#anchor` the heading), the README's list names every page of docs/, and every figure a page
quotes from benchmarks/results/ is that file's own.

A quoted figure is a number with a decimal point or an exponent, or with a unit (`21.6x`, `45%`,
`5.4 ms`, `606 s`, `1,289-1,418 tok/s`, `216K`), or a number in a table row: results, not
settings (`T=1024`, `L6 H6 E384`, `--gpus 2`), versions (`CuPy 14.2`) or dates. A paragraph,
list item, table or example block that quotes figures carries `<!-- quoted from PATH -->`
(several when it quotes several files), and each of its figures must be a number PATH holds,
at the precision quoted (a quoted 5.4 is a held 5.43; a quoted 46% a held 45.8%; a quoted 216K
matches nothing: quote 216,444 as the file writes it). Every
figure in a section that cites `benchmarks/results/` needs such a marker, unless NOT_RESULTS
names it as a setting, a constant or a published figure. The blocks generated from result
files (`<!-- example: ... -->`) are checked in test_readme.py.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
QUOTED = re.compile(r"<!-- quoted from (\S+) -->")
# docs/distributed.md's multi-node table is arithmetic on quoted figures, checked as such.
ARITHMETIC = "<!-- arithmetic: t = 2 (n - 1) / n x S / B -->"
RESULTS = "benchmarks/results/"

NUMBER = r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
UNIT = (r"(?:x|%|K|\s?(?:s|ms|µs|min|minutes|hours|tok/s|tokens/s|GFLOP(?:/s)?|TFLOP(?:/s)?"
        r"|GB/s|GB|MB|MiB|GiB|Gb/s|GbE|points))")
# A number not glued to a word, a dot, `=` or `/` (names, versions, settings, paths), with an
# optional second end of a range, and a unit.
FIGURE = re.compile(rf"(?<![\w.=/^])({NUMBER})(?:\s?[-–]\s?({NUMBER}))?({UNIT})?(?![\w]|\.\d)")
# A table cell that is a result: numbers (a range, a spread in brackets) with a unit.
CELL = re.compile(rf"[\d.,()\-–±/ ]*\d[\d.,()\-–±/ ]*{UNIT}?")
# A tool's version, not a result.
VERSION = re.compile(r"\b(?:CuPy|PyTorch|NumPy|numpy|numba|Python|Slurm|CUDA|OpenBLAS|torch"
                     r"|transformers|mpi4py|Debian's Slurm) \d[\d.]*\+?")

# Figure-looking phrases in sections that cite results which are not results: hardware
# names, published peaks and line rates, constants, settings. Matched as written, per page.
NOT_RESULTS = {
    "benchmarks.md": ["H100 80GB", "0.85x", "(default 1)", "16-byte", "16-bit"],
    "configuration.md": ["defaults to 0.9", "1e-5 relative", "(0.05-0.5)", "about 1e-3",
                         "(3.4445, -4.7750, 2.0315)", "(0.25, embedding 0.1, whole-word 0.1)"],
    "distributed.md": ["400 Gb/s", "50 GB/s", "200 Gb/s", "25 GB/s", "200 GbE", "100 GbE",
                       "12.5 GB/s", "4-byte"],
    "profiling.md": ["0.5% of", "100% of"],
    "generation.md": ["1e-5"],
}


def without_code(text: str) -> str:
    """A text without its fenced code blocks: a link in an example is not a link, and the
    example blocks generated from result files are checked in test_readme.py."""
    return re.sub(r"^```.*?^```", " ", text, flags=re.S | re.M)


def prose(page: Path) -> str:
    return without_code(page.read_text(encoding="utf-8"))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def links(page: Path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", prose(page))
            if not re.match(r"[a-z][a-z+.-]*:", t)]  # http:, mailto: ...


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif fragment and file.suffix == ".md":
            headings = re.findall(r"^#+\s+(.*)$", prose(file), re.M)
            if fragment not in {anchor(h) for h in headings}:
                broken.append(f"{target}: no heading #{fragment} in {file.name}")
    assert broken == []


def test_the_readme_lists_every_page_of_docs() -> None:
    listed = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", (REPO / "README.md").read_text()))
    assert sorted(p.name for p in (REPO / "docs").glob("*.md")) == sorted(listed)


def sections(page: Path) -> list[list[str]]:
    """A page's sections (split at headings), each a list of units: a paragraph, a list item,
    a table, or a fenced block with the lines right before it (where its marker goes)."""
    found: list[list[str]] = [[]]
    block: list[str] = []
    fence = False

    def close() -> None:
        text = "\n".join(block).strip()
        block.clear()
        if text:  # a list item starts a unit of its own
            found[-1].extend(u for u in re.split(r"\n(?=\s*(?:[-*]|\d+\.) )", text) if u.strip())

    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and re.match(r"#+ ", line):
            close()
            found.append([])
        elif not fence and not line.strip():
            close()
        else:
            block.append(line)
    close()
    return found


def figures(text: str, page: str = "") -> list[str]:
    """The figures of a text (see the module's docstring), as the numbers written."""
    for phrase in NOT_RESULTS.get(page, []):
        text = text.replace(phrase, " ")
    text = VERSION.sub(" ", QUOTED.sub(" ", text))
    text = re.sub(r"`-?[\d.e+-]+`", " ", text)  # a value to type, such as a key's default
    text = re.sub(r"\d{4}-\d\d-\d\dT[\d:]+Z", " ", text)  # a timestamp
    found = []
    for line in text.splitlines():
        row = line.strip().startswith("|")
        for part in line.strip().strip("|").split("|") if row else [line]:
            cell = row and CELL.fullmatch(part.strip())
            for low, high, unit in FIGURE.findall(part):
                if unit or cell or re.search(r"[.e]", low + high):
                    found += [low, high] if high else [low]
    return found


def without_header(unit: str) -> str:
    """A table's rows without its header row (column names such as `B (GB/s)`)."""
    return re.sub(r"^\|.*\n", "", unit, count=1, flags=re.M)


def units_to_check(page: Path) -> list[tuple[str, list[str], bool]]:
    """Each unit of the page as (text without a table's header row, its markers' files,
    whether its section cites benchmarks/results/)."""
    found = []
    for section in sections(page):
        cites = any(RESULTS in unit for unit in section)
        for unit in section:
            found.append((without_header(unit), QUOTED.findall(unit), cites))
    return found


@cache
def held(source: str) -> tuple[Decimal, ...]:
    """Every number a result file holds, but those no figure can be (a commit such as
    54e405b reads as 54e405, past what Decimal can round)."""
    text = (REPO / source).read_text(encoding="utf-8")
    numbers = (Decimal(n.replace(",", "")) for n in re.findall(NUMBER, text, flags=re.I))
    return tuple(n for n in numbers if abs(n.adjusted()) < 20)


def holds(source_numbers: tuple[Decimal, ...], quoted: str) -> bool:
    """Whether a file holds the quoted number at the precision it is quoted (either rounding
    of a tie)."""
    want = Decimal(quoted.replace(",", ""))
    step = Decimal(1).scaleb(want.as_tuple().exponent)
    return any(n.quantize(step, rounding) == want for n in source_numbers
               for rounding in (ROUND_HALF_UP, ROUND_HALF_EVEN))


def unheld(unit: str, sources: list[str], page: str) -> list[str]:
    """The figures of a marked unit that none of its cited files holds."""
    numbers = tuple(n for source in sources for n in held(source))
    return [f for f in figures(unit, page) if not holds(numbers, f)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_quoted_figures_are_the_cited_files_own(page: Path) -> None:
    stale = []
    for unit, sources, _ in units_to_check(page):
        if sources:
            assert all((REPO / s).is_file() for s in sources), sources
            assert figures(unit, page.name), f"a marker on a unit that quotes nothing: {unit}"
            stale += [(unit[:60], sources, f) for f in unheld(unit, sources, page.name)]
    assert stale == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_figure_near_a_cited_result_has_a_marker(page: Path) -> None:
    """A section that cites benchmarks/results/ quotes no figure unchecked: each unit with a
    figure carries its file's marker (or NOT_RESULTS says the figure is not a result)."""
    unmarked = [(unit[:60], figures(without_code(unit), page.name))
                for unit, sources, cites in units_to_check(page)
                if cites and not sources and ARITHMETIC not in unit
                and figures(without_code(unit), page.name)]
    assert unmarked == []


def near(written: str, value: float) -> bool:
    """Whether a figure is a value rounded to the figure's own decimals."""
    decimals = len(written.partition(".")[2])
    return abs(float(written) - value) <= 0.5 * 10 ** -decimals + 1e-9


def test_the_multi_node_table_is_its_arithmetic() -> None:
    """docs/distributed.md's scaling on paper: each row's all-reduce bound and efficiencies
    follow from its bandwidth B and GPU count n, and from the buffer sizes S and the 1-GPU
    step times quoted (and checked) above it."""
    text = (REPO / "docs" / "distributed.md").read_text(encoding="utf-8")
    sizes = dict(re.findall(r"\*\*([\d.]+) MB \((small|medium)\)\*\*", text))
    steps = dict(re.findall(r"\*\*([\d.]+) ms \((small|medium)\)\*\*", text))
    table = text.split(ARITHMETIC + "\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert len(table) >= 8 and set(sizes.values()) == set(steps.values()) == {"small", "medium"}
    size = {shape: float(s) for s, shape in sizes.items()}
    step = {shape: float(s) for s, shape in steps.items()}
    for row in table:
        _, b, shape, n, t, compute, plain, overlap = (
            cell.strip().rstrip("%") for cell in row.strip(" |").split("|"))
        bound = 2 * (int(n) - 1) / int(n) * size[shape] / float(b)
        assert near(t, bound) and near(compute, step[shape]), row
        assert near(plain, 100 * step[shape] / (step[shape] + bound)), row
        assert near(overlap, 100 * min(1.0, step[shape] / bound)), row


def test_the_checks_catch_a_stale_or_unmarked_figure() -> None:
    """The checks themselves: the quality file holds 83.15 ± 0.36 (so 83.15 and 83.2 quote it)
    but no 83.51; figures are results, not settings, versions or dates."""
    source = "benchmarks/results/quality-h100.md"
    assert unheld("83.15 ± 0.36, 83.2 <!-- quoted from x -->", [source], "") == []
    assert unheld("83.51 ± 0.36", [source], "") == ["83.51"]
    assert figures("21.6x at 5.4 ms, 33-74%, 1,217-1,314 tok/s, 606 s, 216K") == [
        "21.6", "5.4", "33", "74", "1,217", "1,314", "606", "216"]
    assert figures("L6 H6 E384, T=1024, --gpus 2, CuPy 14.2, 2026-11-22, 4 x H200, 3 seeds") == []
    assert figures("| seed | fp32 | 1.5 | 306 (287–315) |") == ["1.5", "306", "287", "315"]
