"""Reading .npz archives that may be damaged or hostile, without trusting their sizes.

An .npy member's header declares its shape and dtype, and NumPy allocates that many bytes
before reading any data: a header claiming 2^40 elements asks for terabytes, and the zip's own
size fields, which could vouch for the data, are as easily faked. So before anything is
allocated, each member's declared size is held against what the file can really hold: a stored
member's bytes in the file (which must lie inside the file), a deflated member's compressed
bytes times deflate's maximum ratio; and against an absolute limit.
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from collections.abc import Iterable
from typing import IO, Any

import numpy as np

from ...reporting.text import byte_size

DEFLATE_RATIO = 1032  # deflate's maximum expansion: one compressed byte is at most 1032 bytes
MAX_ARRAY_BYTES = 1 << 36  # 64 GiB: several times any array of a model one host trains
_MAGIC = b"PK\x03\x04"


class NpzError(Exception):
    """Why an archive cannot be read; the message completes "FILE is not readable: ..."."""


def read(path: str | os.PathLike[str], names: Iterable[str] | None = None) -> dict[str, Any]:
    """The arrays of the .npz at `path` by name (without `.npy`): those of `names` it has, or
    all. Any damage, pickled objects, or a declared size the file cannot back is an NpzError;
    an OSError opening the file is left to the caller (the file is unreadable, not damaged)."""
    with open(path, "rb") as f:
        if f.read(len(_MAGIC)) != _MAGIC:
            raise NpzError("it is not an .npz (zip) archive")
    try:
        disk = os.path.getsize(path)
        with zipfile.ZipFile(path) as archive:
            members = {info.filename[: -len(".npy")] if info.filename.endswith(".npy")
                       else info.filename: info for info in archive.infolist()}
            wanted = members if names is None else [n for n in names if n in members]
            return {name: _read_member(archive, members[name], name, disk) for name in wanted}
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise NpzError(f"the archive is damaged or truncated ({exc})") from None


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str,
                 disk: int) -> np.ndarray:
    if info.flag_bits & 0x1:
        raise NpzError(f"its member {name!r} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise NpzError(f"its member {name!r} is compressed with zip method "
                       f"{info.compress_type}; only stored and deflated members are read")
    if info.header_offset + info.compress_size > disk:
        raise NpzError(f"its member {name!r} claims {info.compress_size:,} bytes at offset "
                       f"{info.header_offset:,}, past the end of the {disk:,}-byte file")
    with archive.open(info) as f:
        shape, dtype, header = _header(f, name)
    if dtype.hasobject:
        raise NpzError(f"its array {name!r} holds pickled Python objects, which rustyflow "
                       f"never loads (they could run code)")
    declared = math.prod(shape) * dtype.itemsize
    stored = info.compress_type == zipfile.ZIP_STORED
    room = min(info.file_size, info.compress_size * (1 if stored else DEFLATE_RATIO)) - header
    if declared > room:
        raise NpzError(f"its array {name!r} declares {byte_size(declared)} (shape {shape}, "
                       f"{dtype}), more than the {byte_size(max(room, 0))} of data its "
                       f"{info.compress_size:,} {'stored' if stored else 'compressed'} bytes "
                       f"can hold")
    if declared > MAX_ARRAY_BYTES:
        raise NpzError(f"its array {name!r} declares {byte_size(declared)} (shape {shape}, "
                       f"{dtype}), over the {byte_size(MAX_ARRAY_BYTES)} rustyflow reads as one "
                       f"array")
    with archive.open(info) as f:
        try:
            return np.lib.format.read_array(f, allow_pickle=False)
        except ValueError:
            raise NpzError(f"its array {name!r} is damaged or truncated") from None


def _header(f: IO[bytes], name: str) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """A member's declared shape and dtype, and the bytes its header takes."""
    try:
        version = np.lib.format.read_magic(f)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _fortran, dtype = read(f)
    except ValueError:
        raise NpzError(f"its member {name!r} is not a NumPy array (a damaged or missing .npy "
                       f"header)") from None
    return shape, dtype, f.tell()

