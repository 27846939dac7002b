"""Shared fixtures: devices to parametrize over (GPU cases skip cleanly without CUDA), and the
folders the training tests run in (tiny_dir; workspace, a tiny run already trained there).

A module whose every test runs in tiny_dir says so with
`pytestmark = pytest.mark.usefixtures("tiny_dir")`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import TINY, TINY_TEXT, TRAIN, env_file, invoke

from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.training.config.config import KEYS

_GPU_REASON = gpu_unavailable_reason()
REPO_ROOT = Path(__file__).resolve().parents[1]

DEVICES = [
    "cpu",
    pytest.param(
        "gpu",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(_GPU_REASON is not None, reason=str(_GPU_REASON)),
        ],
    ),
]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


def real_data_dir() -> Path | None:
    """Where the real WikiText-2 lives for tests ($RUSTYFLOW_DATA_DIR, else ../shared/data)."""
    for candidate in (os.environ.get("RUSTYFLOW_DATA_DIR"), REPO_ROOT.parent / "shared" / "data"):
        if candidate and (Path(candidate) / "wikitext-2" / "train.txt").is_file():
            return Path(candidate)
    return None


@pytest.fixture
def tiny_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in tmp_path with the tiny corpus and its config (tiny.env), no config keys in env."""
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.txt").write_text(TINY_TEXT)
    (tmp_path / "tiny.env").write_text(env_file(TINY))
    return tmp_path


@pytest.fixture
def workspace(tiny_dir: Path) -> Path:
    """The folder every fault case starts from: a trained model, a text file, someone's .npz."""
    result = invoke(*TRAIN, "--max-steps", "3")
    assert result.exit_code == 0, result.output
    (tiny_dir / "notes.txt").write_text("my notes, not a log\n")
    np.savez(tiny_dir / "their.npz", weights=np.arange(4.0))
    return tiny_dir


@pytest.fixture(scope="module")
def cublaslt() -> Iterator[SimpleNamespace]:
    """A CublasLt on the GPU backend's own (non-blocking, current) stream, as the trainer
    has it: CuPy's allocations and copies and the cuBLASLt calls are ordered on it."""
    cupy = pytest.importorskip("cupy")
    if _GPU_REASON is not None:
        pytest.skip(_GPU_REASON)
    from rustyflow_py.engine.library import get_backend
    from rustyflow_py.engine.ops.gemm.cublaslt import CublasLt

    backend = get_backend("gpu")
    backend.stream.use()
    lt = CublasLt(cupy, backend.stream)
    yield SimpleNamespace(cupy=cupy, stream=backend.stream, lt=lt)
    backend.stream.synchronize()
    lt.close()
