"""Numbers and free text as the log block and ``rustyflow report`` print them.

Any field may be missing from a record (see record_schema), so every formatter here prints a
missing or non-numeric value as ``n/a`` instead of failing: a block is written at the very end
of a run, often an interrupted or failed one, and must never lose the record.
"""

from __future__ import annotations

import textwrap
from typing import Any

from .record_schema import is_num

NA = "n/a"


def number(x: Any, spec: str, suffix: str = "") -> str:
    """`x` in the format `spec`, then `suffix`; n/a when `x` is not a number."""
    return f"{x:{spec}}{suffix}" if is_num(x) else NA


def share(part: float, whole: float) -> str:
    """`part` as a percentage of `whole`, one decimal, no sign; n/a of nothing."""
    return f"{100.0 * part / whole:.1f}" if whole > 0 else NA


def pct(part: float, whole: float) -> str:
    """`share` with its % sign."""
    value = share(part, whole)
    return value if value == NA else value + "%"


def byte_size(n: Any) -> str:
    """A byte count in binary units: `512 B`, `1.5 GiB`."""
    if not is_num(n):
        return NA
    value, units = float(n), ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while abs(value) >= 1024 and i < len(units) - 1:
        value, i = value / 1024, i + 1
    if i == 0:
        return f"{value:.0f} B" if value == int(value) else f"{value:.1f} B"
    return f"{value:.1f} {units[i]}"


def one_line(x: Any) -> str:
    """A free-text field on one line, so it can never forge a block or JSON line."""
    return NA if x is None or x == "" else " ".join(str(x).splitlines())


def plural(count: int, word: str) -> str:
    """`1 step`, `2 steps`, `1,000 steps`."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def on_tokens(scored: int, full: int) -> str:
    """How much of a split a perplexity is on: `217,600 tokens` or `20,000 of 217,600
    tokens` (an EVAL_TOKENS subset says so wherever its result is shown)."""
    return f"{scored:,} tokens" if scored == full else f"{scored:,} of {full:,} tokens"


GAP = 2  # spaces between table columns


def table(headers: list[str], rows: list[list[str]], right: set[int],
          width: int | None = None) -> list[str]:
    """Plain aligned text columns: stable without a TTY, and diffable in the log. Given a
    `width` the table is too wide for, its columns fold as a terminal table's do: the first
    column (each row's key) starts every part, the others follow in their order, in as few
    parts as fit and of even widths; a single column wider than that wraps its cells."""
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    if width is None or sum(widths) + GAP * (len(widths) - 1) <= width:
        return _aligned(headers, rows, right, widths)
    parts = _parts(widths, width)
    parts = next(p for cap in range(widths[0], width + 1)
                 if len(p := _parts(widths, cap)) <= len(parts))
    out: list[str] = []
    for part in parts:
        cols = [0, *part]
        room = max(width - sum(widths[c] + GAP for c in cols[:-1]), 8)
        wrapped = [[_wrap(row[c], room) if c == cols[-1] else [row[c]] for c in cols]
                   for row in rows]
        out += ([""] if out else []) + _aligned(
            [headers[c] for c in cols],
            [[cell[k] if k < len(cell) else "" for cell in row]
             for row in wrapped for k in range(max(map(len, row)))],
            {j for j, c in enumerate(cols) if c in right},
            [widths[c] for c in cols[:-1]] + [min(widths[cols[-1]], room)])
    return out


def _parts(widths: list[int], cap: int) -> list[list[int]]:
    """Columns 1.. in order, in groups that fit `cap` after column 0 (greedy)."""
    parts: list[list[int]] = [[]]
    for i in range(1, len(widths)):
        if parts[-1] and sum(widths[c] + GAP for c in (0, *parts[-1], i)) - GAP > cap:
            parts.append([])
        parts[-1].append(i)
    return parts


def _wrap(text: str, width: int) -> list[str]:
    """A cell's text in lines of at most `width` (at spaces where it can)."""
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def _aligned(headers: list[str], rows: list[list[str]], right: set[int],
             widths: list[int]) -> list[str]:
    def line(cells: list[str]) -> str:
        return (" " * GAP).join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)]


def fold(line: str, width: int) -> list[str]:
    """A line of free text in lines of at most `width`, broken at spaces, its continuation
    lines indented so they read as one (a word longer than a line is cut, as a terminal would)."""
    if len(line) <= width:
        return [line]
    lead = " " * (len(line) - len(line.lstrip(" ")) + 2)
    return textwrap.wrap(line, width, subsequent_indent=lead, break_long_words=True,
                         break_on_hyphens=False, drop_whitespace=True) or [line]


def markdown(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """The columns of `table` as a markdown table (a `|` in a cell escaped)."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|"
    return [line(headers), rule, *(line(row) for row in rows)]
