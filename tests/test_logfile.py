"""append_block: created on first use, blocks kept apart, concurrent writers never interleave."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from multiprocessing.synchronize import Barrier
from pathlib import Path

from rustyflow_py.reporting import logfile
from rustyflow_py.reporting.log_parser import parse_log
from rustyflow_py.reporting.log_writer import format_block
from rustyflow_py.reporting.logfile import append_block

WRITERS, BLOCKS_EACH, PAYLOAD_BYTES = 4, 20, 200_000


def payload(writer: int, index: int) -> str:
    """Distinct, checkable content for one block, cheap to regenerate in the parent."""
    seed = hashlib.sha256(f"{writer}-{index}".encode()).hexdigest()
    return (seed * (PAYLOAD_BYTES // len(seed) + 1))[:PAYLOAD_BYTES]


def big_block(writer: int, index: int) -> str:
    record = {
        "version": 1,
        "timestamp": f"w{writer}-b{index}",
        "status": "completed",
        "writer": writer,
        "index": index,
        "message": payload(writer, index),
    }
    return format_block(record)


def _write_many(path: str, writer: int, start: Barrier) -> None:
    start.wait()
    for index in range(BLOCKS_EACH):
        append_block(path, big_block(writer, index))


def test_created_on_first_use_and_blocks_separated(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "training_log.txt"
    path.parent.mkdir()
    append_block(path, "first block")
    append_block(str(path), "second block\n")
    assert path.read_text() == "first block\n\nsecond block\n"


def test_hand_edit_without_final_newline_keeps_next_block_parseable(tmp_path: Path) -> None:
    path = tmp_path / "training_log.txt"
    append_block(path, format_block({"timestamp": "a"}))
    with open(path, "a") as f:
        f.write("a note typed by hand, no newline")
    append_block(path, format_block({"timestamp": "b"}))
    warnings: list[str] = []
    assert parse_log(path.read_text(), warnings) == [{"timestamp": "a"}, {"timestamp": "b"}]
    assert warnings == []


def test_short_writes_are_completed(tmp_path: Path, monkeypatch) -> None:
    real_write = os.write
    calls = []

    def dribble(fd: int, data: bytes) -> int:
        calls.append(len(data))
        return real_write(fd, bytes(data[:1000]))

    monkeypatch.setattr(logfile.os, "write", dribble)
    text = "x" * 10_500
    append_block(tmp_path / "log", text)
    monkeypatch.undo()
    assert (tmp_path / "log").read_text() == text + "\n"
    assert len(calls) == 11


def test_concurrent_writers_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "training_log.txt"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(WRITERS)
    procs = [ctx.Process(target=_write_many, args=(str(path), w, start)) for w in range(WRITERS)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * WRITERS

    text = path.read_text()
    warnings: list[str] = []
    records = parse_log(text, warnings)
    assert warnings == []
    assert len(records) == WRITERS * BLOCKS_EACH
    seen = {(r["writer"], r["index"]) for r in records}
    assert seen == {(w, i) for w in range(WRITERS) for i in range(BLOCKS_EACH)}
    for r in records:
        assert r["message"] == payload(r["writer"], r["index"])
    for writer in range(WRITERS):  # each writer's blocks land in its own order
        mine = [r["index"] for r in records if r["writer"] == writer]
        assert mine == list(range(BLOCKS_EACH))
    for r in records:  # the human part of every block is contiguous too
        assert text.count(big_block(r["writer"], r["index"])) == 1
