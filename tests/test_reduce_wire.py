"""The wire a data-parallel gradient travels in (GRAD_REDUCE_DTYPE=bf16), on every device:
test_data_parallel.py runs with the GPU disabled, so the GPU's side-stream rule lives here."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rustyflow_py.distributed.data_parallel import Wire
from rustyflow_py.engine.library import get_backend


class Buffer:
    """What Wire reads of a ParameterBuffer."""

    def __init__(self, backend: Any, host: np.ndarray) -> None:
        self.backend = backend
        self.grad_storage = backend.from_host(host.copy())  # the CPU's from_host keeps `host`


def current_stream(backend: Any) -> Any:
    """The stream CuPy launches on now (None on the CPU)."""
    if backend.kind != "gpu":
        return None
    import cupy

    return cupy.cuda.get_current_stream().ptr


# 8:4104 starts on a 16-byte vector of both dtypes (the cast kernels' path); 3:4096 does not
# (CuPy's element-wise fallback)
@pytest.mark.parametrize(("start", "stop"), [(8, 4104), (3, 4096)], ids=["vectors", "odd"])
def test_the_bf16_wire_casts_on_the_collectives_stream_and_leaves_the_backends_current(
        device: str, start: int, stop: int) -> None:
    """On the GPU the casts and the collective run on the collective's side stream, and
    afterwards the backend's own stream is current again: `with stream:` would leave the
    legacy default stream current, and the rest of backward would run outside the captured
    graph. The sum comes back as the bf16-rounded gradient, doubled, in float32."""
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    backend = get_backend(device)
    host = np.random.default_rng(0).standard_normal(4200).astype(np.float32)
    buffer = Buffer(backend, host)
    wire = Wire(buffer, bf16)  # type: ignore[arg-type]
    side = None
    if backend.kind == "gpu":
        import cupy

        backend.make_current()
        side = cupy.cuda.Stream(non_blocking=True)
    seen: list[Any] = []

    def doubling(x: Any, stream: Any) -> None:
        assert x.dtype == bf16
        seen.append((stream, current_stream(backend)))
        x[...] = (x.astype(np.float32) * 2).astype(bf16)

    grad = buffer.grad_storage[start:stop]
    wire.sum(doubling, grad, wire.view(start, stop), slice(None), side)
    if side is not None:
        side.synchronize()
    assert seen == [(side, None if side is None else side.ptr)]
    assert current_stream(backend) == (None if side is None else backend.stream.ptr)
    got = backend.to_host(buffer.grad_storage)
    want = 2 * host[start:stop].astype(bf16).astype(np.float32)
    np.testing.assert_array_equal(got[start:stop], want)
    np.testing.assert_array_equal(got[:start], host[:start])
    np.testing.assert_array_equal(got[stop:], host[stop:])


def test_a_failing_collective_still_leaves_the_backends_stream_current(device: str) -> None:
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    backend = get_backend(device)
    buffer = Buffer(backend, np.ones(64, np.float32))
    wire = Wire(buffer, bf16)  # type: ignore[arg-type]
    side = None
    if backend.kind == "gpu":
        import cupy

        backend.make_current()
        side = cupy.cuda.Stream(non_blocking=True)

    def failing(x: Any, stream: Any) -> None:
        raise RuntimeError("peer gone")

    with pytest.raises(RuntimeError, match="peer gone"):
        wire.sum(failing, buffer.grad_storage[:64], wire.view(0, 64), slice(None), side)
    assert current_stream(backend) == (None if side is None else backend.stream.ptr)


def test_a_float32_wire_is_the_gradient_itself(device: str) -> None:
    backend = get_backend(device)
    buffer = Buffer(backend, np.arange(16, dtype=np.float32))
    wire = Wire(buffer, None)  # type: ignore[arg-type]
    assert wire.copy is None and wire.view(0, 16) is None
    calls: list[Any] = []
    grad = buffer.grad_storage[4:12]
    wire.sum(lambda x, stream: calls.append(x), grad, None)
    assert len(calls) == 1 and calls[0] is grad
