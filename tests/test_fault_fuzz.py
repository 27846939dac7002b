"""Errors, not tracebacks: every config value and every file the product reads, fuzzed.

Config values: every key set to an enormous number, nan, -inf, binary bytes, whitespace.
Files: config files, datasets, checkpoints (for eval, generate and --resume, including .npy
members with wrong dtypes, NaN, huge shapes and damaged headers), logs (report, plot) and
benchmark JSON, each truncated, empty, binary, whitespace-only or holding enormous numbers.
Each command must answer with exit status 0 or 1 and, on 1, one `Error:` line; no Python
exception may escape, and no file that was there before may change.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import TRAIN, TRAINED, assert_intact, env_file, invoke, snapshot

from rustyflow_py.training.config.config import KEYS

pytestmark = pytest.mark.usefixtures("tiny_dir")

VALUES = {"enormous": "9" * 30, "1e26": "1e26", "nan": "nan", "-inf": "-inf",
          "binary": "\x01\x7f\ufffd", "blank": " "}


def answer(*args: str) -> str:
    """Run a command; it must end with 0 or one error line (1), never an exception."""
    result = invoke(*args)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args}: {result.exception!r}\n{result.output}")
    assert result.exit_code in (0, 1), result.output
    assert "Traceback" not in result.output
    if result.exit_code == 1:
        assert "Error: " in result.output, result.output
    return result.output


@pytest.mark.parametrize("value", VALUES.values(), ids=VALUES.keys())
@pytest.mark.parametrize("key", list(KEYS))
def test_every_config_value(key: str, value: str, tiny_dir: Path) -> None:
    (tiny_dir / "fuzz.env").write_text(env_file({
        "DATASET": "tiny.txt", "SEQ_LEN": 16, "BATCH_SIZE": 4, "EMBED_DIM": 32,
        "NUM_HEADS": 2, "NUM_LAYERS": 1, "DEVICE": "cpu", "PROFILE": "false",
        "LOG_FILE": "log.txt", "MODEL_PATH": "models/fuzz.npz", "MAX_STEPS": 2, key: value}))
    before = snapshot(tiny_dir)
    answer("train", "--config", "fuzz.env")
    assert_intact(before, snapshot(tiny_dir))


# ------------------------------------------------------------------------------ files


def npy(header: bytes, body: bytes = b"") -> bytes:
    """An .npy member with this header text (padded as format 1.0 requires)."""
    pad = (64 - (10 + len(header) + 1) % 64) % 64
    text = header + b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + body


def with_member(good: Path, name: str, data: bytes) -> bytes:
    """`good`'s archive with member `name` replaced by `data`."""
    out = io.BytesIO()
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, data if item.filename == name else src.read(item))
    return out.getvalue()


def saved(**arrays: object) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def checkpoint_variants(good: Path) -> dict[str, bytes]:
    data = good.read_bytes()
    z = np.load(good)
    meta = json.loads(str(z["meta"]))
    arrays = {k: z[k] for k in z.files}

    def meta_with(**changes: object) -> bytes:
        return saved(**{**arrays, "meta": np.array(json.dumps({**meta, **changes}))})

    return {
        "empty": b"", "blank": b" \n\t", "binary": bytes(range(256)) * 8,
        "truncated": data[: len(data) // 2], "zip-magic-only": b"PK\x03\x04" + b"\xff" * 64,
        "huge-shape": with_member(good, "param/wte.npy", npy(
            b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }")),
        "huge-header": with_member(good, "param/wte.npy", b"\x93NUMPY\x02\x00"
                                   + struct.pack("<I", 2**31) + b"{"),
        "object-member": with_member(good, "param/wte.npy", npy(
            b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", b"\x80\x04N.")),
        "string-weights": saved(**{**arrays, "param/wte": np.array(["x"])}),
        "complex-weights": saved(**{**arrays, "param/wte": arrays["param/wte"] + 0j}),
        "nan-weights": saved(**{**arrays, "param/wte": arrays["param/wte"] * np.nan}),
        "meta-not-text": saved(**{**arrays, "meta": np.arange(3)}),
        "meta-a-list": saved(**{**arrays, "meta": np.array("[1, 2]")}),
        "config-enormous": meta_with(config={**meta["config"], "EMBED_DIM": 10**30}),
        "config-nan": meta_with(config={**meta["config"], "LEARNING_RATE": float("nan")}),
        "config-wrong-type": meta_with(config={**meta["config"], "NUM_LAYERS": [1]}),
        "history-wrong-type": meta_with(train={**meta["train"], "epoch": None}),
        "history-a-string": meta_with(train="step 3"),
        "vocab-numbers": saved(**{**arrays, "vocab": np.arange(9)}),
        "vocab-empty": saved(**{**arrays, "vocab": np.array([], dtype="U1")}),
    }


def test_every_checkpoint_damage(workspace: Path) -> None:
    for name, data in checkpoint_variants(workspace / TRAINED[0]).items():
        path = f"bad-{name}.npz"
        Path(path).write_bytes(data)
        before = snapshot(workspace)
        answer("eval", "--model", path, "--device", "cpu")
        answer("generate", "--model", path, "--device", "cpu", "--prompt", "the",
               "--max-tokens", "2")
        answer(*TRAIN, "--resume", path, "--model-path", f"models/r-{name}.npz",
               "--max-steps", "4")
        assert_intact(before, snapshot(workspace), replaced=(path,))


def text_variants(good: bytes) -> dict[str, bytes]:
    return {"empty": b"", "blank": b" \n\t\n", "binary": bytes(range(256)) * 8,
            "truncated": good[: len(good) // 2], "nul": b"\x00" * 64,
            "enormous-number": good.replace(b'"steps": 3', b'"steps": 1e999', 1),
            "nan": good.replace(b'"steps": 3', b'"steps": NaN', 1),
            "huge": good * 200}


def test_every_log_damage(workspace: Path) -> None:
    for name, data in text_variants(Path("log.txt").read_bytes()).items():
        path = f"log-{name}.txt"
        Path(path).write_bytes(data)
        before = snapshot(workspace)
        for fmt in ("table", "json", "markdown"):
            answer("report", "--log", path, "--format", fmt)
        if name == "nan":  # drawing takes seconds: one run with a nan in it
            answer("plot", "--log", path, "--out", f"plots-{name}", "--format", "png")
        assert_intact(before, snapshot(workspace))


def test_every_bench_json_damage(workspace: Path) -> None:
    good = json.dumps({"vocab": 9, "seconds": 1.0, "devices": ["cpu"], "rows": []}).encode()
    variants = {**text_variants(good), "a-list": b"[1, 2]", "no-rows": b'{"vocab": 9}',
                "rows-of-numbers": b'{"rows": [1, 2]}', "nan-rows": b'{"rows": NaN}'}
    for name, data in variants.items():
        path = f"bench-{name}.json"
        Path(path).write_bytes(data)
        before = snapshot(workspace)
        answer("bench", "--from-json", path, "--out", f"bench-{name}")
        assert_intact(before, snapshot(workspace))


def test_every_config_file_and_dataset_damage(workspace: Path) -> None:
    for name, data in {**text_variants(Path("tiny.env").read_bytes()),
                       "one-word": b"word\n", "one-long-line": b"the cat " * 50_000}.items():
        Path(f"cfg-{name}.env").write_bytes(data)
        Path(f"data-{name}.txt").write_bytes(data)
        before = snapshot(workspace)
        answer("train", "--config", f"cfg-{name}.env", "--dataset", "tiny.txt", "--device",
               "cpu", "--model-path", f"models/c-{name}.npz", "--max-steps", "1")
        answer(*TRAIN, "--dataset", f"data-{name}.txt", "--model-path",
               f"models/d-{name}.npz", "--max-steps", "1")
        assert_intact(before, snapshot(workspace))
