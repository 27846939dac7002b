"""Bounded reads: an .npz member's declared size is checked before anything is allocated.

A member's .npy header declares its shape, and the zip's size field can be faked to agree, so
each read holds the declared size against the bytes the member really occupies (stored), its
compressed bytes times deflate's maximum ratio (deflated), and an absolute limit. The hostile
archives here are made by writing .npy headers by hand, never by allocating what they declare.
"""

from __future__ import annotations

import io
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import TRAIN, TRAINED, assert_intact, invoke, snapshot

from rustyflow_py.training.outputs import npz

BIG = 1 << 26  # 64 MiB: more than any command here allocates for the tiny model
TERA = 2**40  # elements a hostile header declares
BAD = "bad-cpu.npz"  # where `train --model-path bad-cpu.npz` writes: the path as typed


def npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype, "fortran_order": False,
                                               "shape": shape})
    return out.getvalue()


def hostile(good: Path, member: str, shape: tuple[int, ...], dtype: str, *,
            fake_size: bool = False, deflate: bool = False) -> bytes:
    """`good`'s archive with `member` holding only a header that declares `shape` x `dtype`
    and a few bytes of data; `fake_size` makes the zip's size field agree with the header."""
    header = npy_header(shape, dtype)
    out = io.BytesIO()
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            if item.filename != f"{member}.npy":
                dst.writestr(item, src.read(item))
                continue
            method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
            dst.writestr(item.filename, header + b"\0" * 64, compress_type=method)
            if fake_size:
                declared = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
                dst.getinfo(item.filename).file_size = len(header) + declared
    return out.getvalue()


def refused(workspace: Path, data: bytes, *args: str) -> str:
    """Run a command on the checkpoint `data` (written to BAD): exit 1 with one Error line,
    no traceback, nothing big allocated, every file that was there unchanged. Its error
    line."""
    Path(BAD).write_bytes(data)
    before = snapshot(workspace)
    tracemalloc.start()
    try:
        result = invoke(*args)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, MemoryError)
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    assert peak < BIG, f"{args} allocated {peak:,} bytes"
    assert_intact(before, snapshot(workspace))
    return errors[0]


READERS = {
    "eval": ("eval", "--model", BAD, "--device", "cpu"),
    "generate": ("generate", "--model", BAD, "--device", "cpu", "--prompt", "the",
                 "--max-tokens", "2"),
}
TRAINERS = {
    "model-path": (*TRAIN, "--model-path", BAD, "--max-steps", "2"),
    "resume": (*TRAIN, "--resume", BAD, "--model-path", "models/r.npz"),
    "init-from": (*TRAIN, "--init-from", BAD, "--model-path", "models/f.npz",
                  "--max-steps", "2"),
}


@pytest.mark.parametrize("fake_size", [False, True], ids=["honest-zip", "faked-zip-size"])
@pytest.mark.parametrize("command", [*READERS, *TRAINERS])
def test_a_meta_declaring_a_terabyte_is_refused_before_allocating(
        workspace: Path, command: str, fake_size: bool) -> None:
    args = {**READERS, **TRAINERS}[command]
    line = refused(workspace, hostile(workspace / TRAINED[0], "meta", (TERA,), "<U1",
                                      fake_size=fake_size), *args)
    assert BAD in line
    if command == "model-path":  # an output path: not rustyflow's, so never overwritten
        assert "exists and is not a rustyflow checkpoint" in line
        assert "set --model-path to another file" in line
    else:
        assert "its array 'meta' declares 4.0 TiB" in line
        assert "more than the 64 B of data its 192 stored bytes can hold" in line
        assert "pass another file to" in line


def test_a_deflated_member_beyond_the_ratio_is_refused(workspace: Path) -> None:
    """1 GiB declared in a few dozen compressed bytes, with the zip's size field agreeing:
    deflate cannot expand them that far, so the member is refused before 1 GiB is taken."""
    data = hostile(workspace / TRAINED[0], "param/wte", (1 << 28,), "<f4", fake_size=True,
                   deflate=True)
    line = refused(workspace, data, *READERS["eval"])
    assert "its array 'param/wte' declares 1.0 GiB (shape (268435456,), float32)" in line
    assert "compressed bytes can hold" in line and "pass another file to --model" in line


def test_an_honest_compressed_archive_reads_back(tmp_path: Path) -> None:
    """The ratio bound never refuses what deflate really made: zeros compress about as far
    as deflate goes."""
    arrays = {"zeros": np.zeros(1 << 22, np.float32), "words": np.array(["a", "bc"])}
    np.savez_compressed(tmp_path / "z.npz", **arrays)
    got = npz.read(tmp_path / "z.npz")
    assert got.keys() == arrays.keys()
    assert all(np.array_equal(got[k], v) for k, v in arrays.items())
    assert npz.read(tmp_path / "z.npz", ["words", "absent"]).keys() == {"words"}


def test_a_member_beyond_the_absolute_limit_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    np.savez(tmp_path / "a.npz", x=np.zeros(300, np.float32))
    monkeypatch.setattr(npz, "MAX_ARRAY_BYTES", 1024)
    with pytest.raises(npz.NpzError, match=r"'x' declares 1.2 KiB .* over the 1.0 KiB"):
        npz.read(tmp_path / "a.npz")


def test_a_stored_size_past_the_end_of_the_file_is_refused(tmp_path: Path) -> None:
    """A stored member whose compressed size (and file size) is faked: the claim is held
    against the file's size on disk."""
    out = tmp_path / "a.npz"
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("x.npy", npy_header((TERA,), "<f4") + b"\0" * 64)
        z.getinfo("x.npy").file_size = z.getinfo("x.npy").compress_size = 4 * TERA + 128
    with pytest.raises(npz.NpzError, match=r"'x' claims .* past the end of the"):
        npz.read(out)
