#!/usr/bin/env python3
"""Bring docs/configuration.md's key table and config.env up to date with the declaration.

    .venv/bin/python scripts/sync_config_docs.py          rewrite both files where they differ
    .venv/bin/python scripts/sync_config_docs.py --check  exit 1 and name the files instead

The keys are declared once, as the fields of `Config` in rustyflow_py/training/config/config.py.
The table is regenerated whole from `markdown_table()`. config.env is written by hand (its
comments say more than the one-line help), so only a key it lacks is added: its help as a
comment and its default, after the key declared before it. tests/test_config.py fails, naming
this script, while either file is out of date.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rustyflow_py.training.config.config import KEYS, Key, markdown_table  # noqa: E402

DOCS = ROOT / "docs" / "configuration.md"
CONFIG_ENV = ROOT / "config.env"


def synced_table(text: str) -> str:
    """`text` (docs/configuration.md) with its key table replaced by markdown_table()."""
    lines = text.splitlines()
    table = markdown_table()
    if table[0] not in lines:
        raise SystemExit(f"{DOCS}: no line {table[0]!r} starts the key table")
    start = lines.index(table[0])
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join([*lines[:start], *table, *lines[end:]]) + "\n"


def _entry(key: Key) -> list[str]:
    """A new key's lines in config.env: its help as a comment, then KEY=default."""
    value = str(key.default).lower() if isinstance(key.default, bool) else str(key.default)
    comment = f"{key.help[:1].upper()}{key.help[1:]}. Default: {value or 'empty'}"
    return [*textwrap.wrap(comment, 96, initial_indent="# ", subsequent_indent="# "),
            f"{key.name}={value}"]


def synced_env(text: str) -> str:
    """`text` (config.env) with every key it lacks added after the key declared before it."""
    lines = text.splitlines()
    previous = None
    for name, key in KEYS.items():
        found = [i for i, line in enumerate(lines) if re.match(rf"(# )?{name}=", line)]
        if not found:
            after = [i for i, line in enumerate(lines)
                     if previous and re.match(rf"(# )?{previous}=", line)]
            at = after[-1] + 1 if after else len(lines)
            lines[at:at] = _entry(key)
        previous = name
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, sync in ((DOCS, synced_table), (CONFIG_ENV, synced_env)):
        old = path.read_text(encoding="utf-8")
        new = sync(old)
        if new != old:
            stale.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
                print(f"updated {path.relative_to(ROOT)}")
    if check and stale:
        print("out of date: " + ", ".join(str(p.relative_to(ROOT)) for p in stale) +
              f"; run {Path(__file__).relative_to(ROOT)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
