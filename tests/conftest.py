"""Shared fixtures: devices to parametrize over (GPU cases skip cleanly without CUDA)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rustyflow_py.engine.backend import gpu_unavailable_reason

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
