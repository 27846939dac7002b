"""Checking a dataset file against its sha256 on every load (cheap next to tokenizing).

A file with an official hash must match it. A file without one (Tiny Shakespeare) is trusted
on first use: its hash goes into a `<file>.sha256` sidecar, checked on every later load.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

from ..errors import DataError, command
from .corpus import read_text
from .registry import Source


def sha256_of(data: bytes) -> str:
    """The hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def expected_sha256(source: Source, name: str, path: Path) -> str | None:
    """Official hash, else the trust-on-first-use sidecar's, else None."""
    sidecar = path.with_name(path.name + ".sha256")
    if name in source.sha256:
        return source.sha256[name]
    return sidecar.read_text().split()[0] if sidecar.is_file() else None


def read_verified(source: Source, name: str, path: Path) -> str:
    """The text of `source`'s file `name` at `path`, once its sha256 is checked (or recorded)."""
    data = path.read_bytes()
    digest, expected = sha256_of(data), expected_sha256(source, name, path)
    if expected is None:
        with contextlib.suppress(OSError):  # a read-only copy just stays unrecorded
            path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    elif digest != expected:
        raise DataError(
            f"checksum mismatch: {path} has sha256 {digest}, expected {expected} "
            f"({source.title}); the file is damaged or a different version. Delete it and run "
            f"`{command()} data download`, or to train on your own text set DATASET=<path>")
    return read_text(path, data)
