"""Tokenized splits cached as memory-mapped token files, so a subword run tokenizes its text once.

A cache file is keyed by the tokenizer's hash and the split text's hash (both in its name), and
holds a 64-byte header, then the ids as little-endian uint16 (vocabularies up to 65,536 tokens)
or uint32::

    b"RFTOKENS" | version u32 | bytes per id u32 | ids u64 | sha256 of the ids (32 bytes) | 0s

It is written to a temp file and renamed into place, and every load checks the size and the
sha256 of the ids: a damaged file is reported, deleted and rebuilt, never used.
The folder is $RUSTYFLOW_CACHE_DIR, else $XDG_CACHE_HOME/rustyflow, else ~/.cache/rustyflow.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..outputs.writing import write_atomically

MAGIC = b"RFTOKENS"
VERSION = 1
HEADER = struct.Struct("<8sIIQ32s")
HEADER_BYTES = 64


def cache_dir() -> Path:
    """Where token files (and trained tokenizers) are cached."""
    given = os.environ.get("RUSTYFLOW_CACHE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "rustyflow"


def text_key(text: str) -> str:
    """The hash of a split's text, half of a cache file's key."""
    return hashlib.sha256(text.encode()).hexdigest()


def token_file(folder: Path, split: str, text_sha: str, tokenizer_sha: str) -> Path:
    return folder / "tokens" / f"{split}-{text_sha[:16]}-{tokenizer_sha[:16]}.tok"


def write_tokens(path: Path, ids: np.ndarray, vocab_size: int) -> Path:
    """Store `ids` (1-D) in the narrowest dtype that holds `vocab_size` ids, atomically."""
    dtype = np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")
    payload = np.ascontiguousarray(ids, dtype=dtype).tobytes()
    header = HEADER.pack(MAGIC, VERSION, dtype.itemsize, len(payload) // dtype.itemsize,
                         hashlib.sha256(payload).digest()).ljust(HEADER_BYTES, b"\0")

    def write(f: BinaryIO) -> None:
        f.write(header)
        f.write(payload)

    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, write)


def read_tokens(path: Path) -> np.ndarray | str:
    """The ids of a cache file, memory-mapped (read-only); or, when the file is damaged, why."""
    size = path.stat().st_size
    if size < HEADER_BYTES:
        return "shorter than its header"
    with open(path, "rb") as f:
        magic, version, itemsize, count, digest = HEADER.unpack(f.read(HEADER.size))
    if magic != MAGIC or version != VERSION or itemsize not in (2, 4):
        return "not a rustyflow token file"
    if size != HEADER_BYTES + count * itemsize:
        return f"{size - HEADER_BYTES} bytes of ids where the header says {count * itemsize}"
    if count == 0:
        return np.zeros(0, f"<u{itemsize}")
    ids = np.memmap(path, dtype=f"<u{itemsize}", mode="r", offset=HEADER_BYTES, shape=(count,))
    if hashlib.sha256(ids).digest() != digest:
        return "its ids do not match their checksum"
    return ids


def cached_tokens(path: Path, encode: Callable[[], np.ndarray], vocab_size: int,
                  warn: Callable[[str], None]) -> np.ndarray:
    """The ids stored at `path`, or `encode()`'s, stored there for next time. A damaged file
    is named in a warning and rebuilt; a cache that cannot be written is only a warning."""
    if path.is_file():
        got = read_tokens(path)
        if isinstance(got, np.ndarray):
            return got
        warn(f"WARN: token cache {path} is damaged ({got}): rebuilding it")
        path.unlink(missing_ok=True)
    ids = encode()
    try:
        write_tokens(path, ids, vocab_size)
    except OSError as exc:
        warn(f"WARN: cannot write the token cache {path} ({exc.strerror}): the text is "
             f"tokenized again next time; set RUSTYFLOW_CACHE_DIR to a writable folder")
        return ids
    got = read_tokens(path)
    return got if isinstance(got, np.ndarray) else ids
