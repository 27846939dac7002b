"""Every file path that a docstring or comment of the package names exists, so the text that
explains the code cannot drift from it (a file renamed, split or removed).

A bare name (`reference.py`, `vec.cuh`) must be some file of the checkout; a path with folders
(`gemm/cpu.py`, `optim/lamb.cu`) must resolve from the checkout, the package, the naming
file's own folder or one above it, or the engine's op library. `NOT_OURS` lists the names that
are not this checkout's files: other projects' files the text compares with, placeholders in
a description of a naming scheme, and outputs a command writes.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rustyflow_py"
PATH = re.compile(r"(?<![\w/.$-])((?:\.\./|[\w.-]+/)*[\w-]+\.(?:py|cu|cuh|md|sh|toml))(?![\w/])")
NOT_OURS = {
    "train.py", "config/x.py", "sample.py",  # nanoGPT's, which the text compares with
    "name.cu", "x.cuh",  # placeholders where cuda_build.py describes its naming scheme
    "bench.md",  # what `bench --out` writes
}


def commentary(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring-like string of a .py, or every `//`
    comment of a CUDA file."""
    source = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        for number, line in enumerate(source.splitlines(), 1):
            if "//" in line:
                yield number, line[line.index("//"):]
        return
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        triple = token.string.lstrip("rbuRBU").startswith(('"""', "'''"))
        if token.type == tokenize.COMMENT or (token.type == tokenize.STRING and triple):
            yield token.start[0], token.string


def exists(name: str, here: Path, names: set[str]) -> bool:
    if "/" not in name:
        return name in names
    bases = [ROOT, PACKAGE, PACKAGE / "engine" / "ops", *here.parents]
    return any((base / name).exists() for base in bases)


def test_every_path_a_docstring_or_comment_names_exists() -> None:
    files = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.cu"), *PACKAGE.rglob("*.cuh")]
    names = {p.name for p in ROOT.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts}
    missing = [f"{path.relative_to(ROOT)}:{line}: {match.group(1)}"
               for path in sorted(files) for line, text in commentary(path)
               for match in PATH.finditer(text)
               if match.group(1) not in NOT_OURS and not exists(match.group(1), path, names)]
    assert missing == [], "these files are named but do not exist:\n" + "\n".join(missing)


def test_the_check_finds_a_path_that_does_not_exist(tmp_path: Path) -> None:
    """A renamed file named in a comment fails the check (and a real one passes)."""
    sample = tmp_path / "sample_module.py"
    sample.write_text('"""See gemm/cpu.py and optim/nosuch.py."""\n# and vec.cuh, gone.cuh\n')
    names = {"vec.cuh"}
    found = [m.group(1) for _, text in commentary(sample) for m in PATH.finditer(text)]
    assert found == ["gemm/cpu.py", "optim/nosuch.py", "vec.cuh", "gone.cuh"]
    assert [n for n in found if not exists(n, PACKAGE / "engine" / "x.py", names)] == [
        "optim/nosuch.py", "gone.cuh"]
