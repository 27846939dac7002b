"""safetensors files, read and written through the `safetensors` library, checked first.

The library maps the file and trusts its header's offsets; a header that declares more bytes
than the file holds (a truncated download, a damaged or hostile file) would fail deep inside
it, or allocate what the header claims. So the header is parsed and every tensor's extent
checked against the file's size before the library opens it, and a lie is named.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InteropError
from ..training.outputs.writing import write_atomically
from .extra import require

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U8": 1, "BOOL": 1}
READABLE = ("F32", "F16", "F64")  # what a weight may be stored as here (read as float32)
MAX_HEADER = 100 * 2**20  # the library's own limit on a header's size


def _bad(path: Path, reason: str) -> InteropError:
    return InteropError(f"{path} is not a usable safetensors file: {reason}; download or "
                        f"export it again")


def read_header(path: Path) -> dict[str, Any]:
    """The header (tensor name -> dtype, shape, data_offsets; `__metadata__`), checked: its
    length and every tensor's byte range lie inside the file, and each range holds exactly
    its shape's bytes."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _bad(path, f"it is {size} bytes, shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise _bad(path, f"its header says it is {length} bytes long, but the file holds "
                             f"only {size - 8} bytes after the length (truncated or damaged)")
        if length > MAX_HEADER:
            raise _bad(path, f"its header says it is {length} bytes long, more than the "
                             f"{MAX_HEADER} a safetensors header may have")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except ValueError:
        raise _bad(path, "its header is not JSON") from None
    if not isinstance(header, dict):
        raise _bad(path, "its header is not a JSON object")
    data = size - 8 - length
    for name, entry in header.items():
        if name != "__metadata__":
            _check_entry(path, name, entry, data)
    return header


def _check_entry(path: Path, name: str, entry: Any, data: int) -> None:
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        need = math.prod(int(d) for d in shape) * ITEMSIZE[dtype]
    except (TypeError, KeyError, ValueError):
        raise _bad(path, f"its header entry for {name!r} is malformed") from None
    if not 0 <= begin <= end <= data:
        raise _bad(path, f"its header places tensor {name!r} at bytes {begin}..{end}, but the "
                         f"data section holds only {data} bytes (the header lies about the "
                         f"file's size: truncated or damaged)")
    if end - begin != need:
        raise _bad(path, f"tensor {name!r} ({dtype}, shape {tuple(shape)}) needs {need} bytes, "
                         f"its header gives it {end - begin}")


def read(path: str | os.PathLike[str], what: str) -> tuple[dict[str, np.ndarray],
                                                               dict[str, str]]:
    """Every tensor of a checked file as a float32 host array, and the file's metadata."""
    target = Path(path)
    header = read_header(target)
    odd = {n: e["dtype"] for n, e in header.items()
           if n != "__metadata__" and e["dtype"] not in READABLE}
    if odd:
        name, dtype = next(iter(odd.items()))
        raise InteropError(f"{target}: tensor {name!r} is stored as {dtype}; rustyflow reads "
                           f"weights stored as {', '.join(READABLE)}: save the model in "
                           f"float32 (e.g. model.float().save_pretrained(DIR))")
    safetensors = require("safetensors", what)
    require("safetensors.numpy", what)
    try:
        with safetensors.safe_open(str(target), framework="numpy") as f:
            meta = f.metadata() or {}
            tensors = {k: np.asarray(f.get_tensor(k), dtype=np.float32) for k in f.keys()}
    except safetensors.SafetensorError as exc:
        raise _bad(target, str(exc)) from None
    return tensors, dict(meta)


def write(path: str | os.PathLike[str], tensors: dict[str, np.ndarray],
          metadata: dict[str, str], what: str) -> Path:
    """The tensors as a safetensors file at `path`, through a temporary file and a rename."""
    st_numpy = require("safetensors.numpy", what)
    blob = st_numpy.save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, metadata)
    return write_atomically(path, lambda f: f.write(blob))


def metadata_of(path: Path) -> dict[str, Any] | None:
    """A safetensors file's `__metadata__` (None when the file is not a readable one)."""
    try:
        meta = read_header(path).get("__metadata__")
    except (InteropError, OSError):
        return None
    return meta if isinstance(meta, dict) else {}
