"""The wire a data-parallel gradient travels in (GRAD_REDUCE_DTYPE=bf16), on every device:
test_data_parallel.py runs with the GPU disabled, so the GPU's side-stream rule lives here."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rustyflow_py.distributed.data_parallel import Wire
from rustyflow_py.engine.library import get_backend


def test_the_bf16_wire_casts_on_the_collectives_stream_and_leaves_the_backends_current(
        device: str) -> None:
    """On the GPU the casts run on the collective's side stream, and afterwards the backend's
    own stream is current again: `with stream:` would leave the legacy default stream
    current, and the rest of backward would run outside the captured graph."""
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    backend = get_backend(device)
    host = np.random.default_rng(0).standard_normal(4099).astype(np.float32)

    class Buffer:  # what Wire reads of a ParameterBuffer (the CPU's from_host keeps `host`)
        grad_storage = backend.from_host(host.copy())

    Buffer.backend = backend
    wire = Wire(Buffer, bf16)  # type: ignore[arg-type]
    seen: list[Any] = []

    def doubling(x: Any, stream: Any) -> None:
        assert x.dtype == bf16
        seen.append(stream)
        x[...] = (x.astype(np.float32) * 2).astype(bf16)

    side = None
    if backend.kind == "gpu":
        import cupy

        backend.make_current()
        side = cupy.cuda.Stream(non_blocking=True)
    grad = Buffer.grad_storage[3:4096]
    wire.sum(doubling, grad, 3, 4096, slice(None), side)
    if side is not None:
        side.synchronize()
        assert cupy.cuda.get_current_stream().ptr == backend.stream.ptr
    got = backend.to_host(Buffer.grad_storage)
    assert seen == [side]
    np.testing.assert_array_equal(got[3:4096], 2 * host[3:4096].astype(bf16).astype(np.float32))
    np.testing.assert_array_equal(got[:3], host[:3])
    np.testing.assert_array_equal(got[4096:], host[4096:])
