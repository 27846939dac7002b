"""Backends: where a tensor's data lives (NumPy on the CPU, CuPy on an NVIDIA GPU).

A backend is the array module (`xp`) plus the fused kernels the ops need (`kernels`).
Ops are written once against `xp`; only the fused kernels differ between devices.
Every host<->device copy goes through `to_host`/`from_host` so it can be counted, and
`strict_transfers()` turns any copy inside a training step into an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import resource
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import DeviceError, TrainingError
from . import devices
from .devices import blas_info, cpu_name, gpu_description, gpu_properties, gpu_unavailable_reason
from .precision import Precision

DEVICES = ("cpu", "gpu", "gpu:N")  # "gpu" is GPU 0; "gpu:N" is GPU N (0-based)


class TransferError(RuntimeError):
    """A host<->device copy happened while transfers were forbidden."""


@dataclasses.dataclass
class TransferStats:
    """Host<->device copies since the last reset (counts and bytes each way)."""

    h2d_count: int = 0
    h2d_bytes: int = 0
    d2h_count: int = 0
    d2h_bytes: int = 0
    strict: bool = False

    def snapshot(self) -> dict[str, int]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "strict"}

    def reset(self) -> None:
        self.h2d_count = self.h2d_bytes = self.d2h_count = self.d2h_bytes = 0


TRANSFERS = TransferStats()


@contextlib.contextmanager
def strict_transfers() -> Iterator[None]:
    """Raise TransferError on any host<->device copy inside the block (GPU syncs too)."""
    previous = TRANSFERS.strict
    TRANSFERS.strict = True
    try:
        yield
    finally:
        TRANSFERS.strict = previous


def _count(direction: str, nbytes: int, device: TransferStats) -> None:
    """Count a copy for its device and for the process (TRANSFERS)."""
    if TRANSFERS.strict:
        raise TransferError(
            f"{direction} copy of {nbytes} bytes inside a transfer-free region "
            "(strict mode): keep the data on the device, or move the copy out of the step"
        )
    for stats in (device, TRANSFERS):
        if direction == "host->device":
            stats.h2d_count += 1
            stats.h2d_bytes += nbytes
        else:
            stats.d2h_count += 1
            stats.d2h_bytes += nbytes


def parse_device(device: str) -> tuple[str, int]:
    """'cpu' -> ('cpu', 0); 'gpu' and 'gpu:0' -> ('gpu', 0); 'gpu:N' -> ('gpu', N)."""
    kind, colon, index = device.partition(":")
    if device == "cpu":
        return "cpu", 0
    if kind == "gpu" and (not colon or index.isdigit()):
        return "gpu", int(index or 0)
    raise DeviceError(f"unknown device {device!r}: expected cpu, gpu (GPU 0) or gpu:N")


def device_name(kind: str, index: int = 0) -> str:
    """The canonical name of a device: cpu, gpu (for GPU 0) or gpu:N."""
    return kind if kind == "cpu" or index == 0 else f"{kind}:{index}"


class Backend:
    """NumPy backend; the CuPy backend overrides what differs.

    A backend is one device instance: `kind` is "cpu" or "gpu", `name` the instance ("cpu",
    "gpu", "gpu:1", ...), `transfers` its host<->device copies.
    """

    kind = "cpu"

    def __init__(self) -> None:
        self.name, self.index = "cpu", 0
        self.transfers = TransferStats()
        self.xp: ModuleType = np
        from .ops.cpu_set import CpuKernels

        self.kernels = CpuKernels(self)

    def set_precision(self, precision: Precision) -> None:
        """Nothing to set: the CPU's GEMMs have one compute mode per dtype (TF32 is a GPU
        mode), and the dtypes come with the arrays."""

    def configure(self, threads: int, cpu_jit: str, say: Callable[[str], None],
                  warn: Callable[[str], None]) -> None:
        """CPU: THREADS and CPU_JIT, compiling the numba kernels now rather than inside the
        first step (so compilation never lands in a step or the profile)."""
        import time

        set_threads(threads)
        kernels = self.kernels
        try:
            kernels.set_jit(cpu_jit)
        except RuntimeError as exc:
            raise DeviceError(str(exc)) from None
        if kernels.jit is None:
            return
        start = time.perf_counter()
        try:
            kernels.jit.warm_up()
        except Exception as exc:  # numba installed but unable to compile on this machine
            if cpu_jit == "on":
                raise TrainingError(f"CPU_JIT=on, but numba could not compile the CPU kernels "
                                    f"({type(exc).__name__}: {exc}); set CPU_JIT=auto or "
                                    "off to train with the NumPy kernels") from exc
            warn(f"WARN: numba could not compile the CPU kernels ({type(exc).__name__}); "
                 "training with the NumPy kernels (CPU_JIT=off silences this)")
            kernels.set_jit("off")
            return
        seconds = time.perf_counter() - start
        if seconds > 1.0:
            say(f"numba CPU kernels compiled in {seconds:.1f}s (cached for later runs)")

    def hardware(self) -> str:
        """The processor's name, for the log's summary line."""
        return cpu_name()

    def from_host(self, array: np.ndarray) -> Any:
        return array

    def to_host(self, array: Any) -> np.ndarray:
        return array

    def synchronize(self) -> None:
        """Wait for queued work (a no-op on the CPU, where work is synchronous)."""

    def make_current(self) -> None:
        """Make this device and its stream the array library's current ones (a no-op on the
        CPU): the library launches its own kernels there, and a backend made later (another
        GPU) may have left its own current."""

    def describe(self) -> str:
        return cpu_description()

    # ---- memory: what the run record reports --------------------------------------------------
    def reset_memory_stats(self) -> None:
        """Start a new run's peak (the process RSS peak cannot be reset on the CPU)."""

    def tracking_memory(self) -> contextlib.AbstractContextManager[None]:
        """Track the peak bytes in use while inside (the GPU's; the CPU reads its RSS)."""
        return contextlib.nullcontext()

    def release_cached_memory(self) -> None:
        """Hand cached free blocks back (the GPU pool's, before a graph takes over)."""

    def memory_stats(self, extra_reserved: int = 0) -> dict[str, Any]:
        """{"kind", "peak_bytes", "pool_total_bytes"}: here the peak process RSS."""
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        return {"kind": "rss", "peak_bytes": int(peak), "pool_total_bytes": None}


class CupyBackend(Backend):
    """CuPy backend for GPU `index`. All its work runs on one non-blocking stream of its own,
    so a step can be captured. Creating it makes its GPU the current one: a process drives one
    GPU at a time (data parallelism runs one process per GPU)."""

    kind = "gpu"

    def __init__(self, index: int = 0) -> None:
        import cupy

        self.name, self.index = device_name("gpu", index), index
        self.transfers = TransferStats()
        cupy.cuda.Device(index).use()
        self.xp = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream.use()
        from .ops.cuda_set import CudaKernels

        self.kernels = CudaKernels(self)
        self.reset_memory_stats()

    def set_precision(self, precision: Precision) -> None:
        """The GEMM compute mode, for RustyFlow's cuBLAS calls and CuPy's own (matmul_compute
        "tf32" lets float32 GEMMs use TF32 tensor cores)."""
        from cupy._core import _routines_linalg as linalg

        tf32 = precision.matmul_compute == "tf32"
        linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32 if tf32
                                else linalg.COMPUTE_TYPE_DEFAULT)
        self.kernels.cublas.matmul_compute = precision.matmul_compute

    def configure(self, threads: int, cpu_jit: str, say: Callable[[str], None],
                  warn: Callable[[str], None]) -> None:
        """THREADS and CPU_JIT are CPU settings."""

    def hardware(self) -> str:
        return str(gpu_properties(self.index)["name"])

    def from_host(self, array: np.ndarray) -> Any:
        _count("host->device", array.nbytes, self.transfers)
        return self.xp.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        _count("device->host", array.nbytes, self.transfers)
        if array.ndim and not array.flags.c_contiguous:
            # CuPy copies a strided array through a `with stream:` that leaves another stream
            # current afterwards, and later kernels would then run outside this backend's
            # stream (unordered with cuBLAS, and missing from graph capture).
            array = self.xp.ascontiguousarray(array)
        return self.xp.asnumpy(array, stream=self.stream)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def make_current(self) -> None:
        self.xp.cuda.Device(self.index).use()
        self.stream.use()

    def describe(self) -> str:
        return gpu_description(self.index)

    # ---- timing: device events on this backend's stream (the profiler's clock) ---------------
    def new_event(self) -> Any:
        return self.xp.cuda.Event()

    def record(self, event: Any) -> None:
        event.record(self.stream)

    def elapsed(self, start: Any, end: Any) -> float:
        """Seconds between two recorded events (both must have completed)."""
        return self.xp.cuda.get_elapsed_time(start, end) / 1e3

    def reset_memory_stats(self) -> None:
        from .memory import PeakMemory

        self._peak = PeakMemory()
        self._eager_pool = 0

    def tracking_memory(self) -> contextlib.AbstractContextManager[None]:
        """Peak bytes in use, counted like torch.cuda.max_memory_allocated."""
        return self._peak.tracking()

    def release_cached_memory(self) -> None:
        pool = self.xp.get_default_memory_pool()
        self._eager_pool = max(self._eager_pool, int(pool.total_bytes()))
        pool.free_all_blocks()

    def memory_stats(self, extra_reserved: int = 0) -> dict[str, Any]:
        """Peak bytes in use while tracked, and the reserved size: the larger of the eager
        phase's default pool and the default pool plus `extra_reserved` (a graph's pool)."""
        pool = self.xp.get_default_memory_pool()
        reserved = max(int(pool.total_bytes()) + extra_reserved, self._eager_pool)
        used = self._peak.peak or reserved
        return {"kind": "gpu_pool", "peak_bytes": used, "pool_total_bytes": reserved}


def resolve_device(requested: str, strict: bool, say: Callable[[str], None],
                   warn: Callable[[str], None]) -> tuple[str, str | None]:
    """The device to use (auto, cpu, gpu or gpu:N requested) and, when a requested GPU is not
    usable, why we fell back to the CPU."""
    if requested == "cpu":
        return "cpu", None
    index = 0 if requested == "auto" else parse_device(requested)[1]
    reason = gpu_unavailable_reason(index)
    if reason is None:
        say(f"INFO: Using GPU: {gpu_description(index)}")
        return device_name("gpu", index), None
    if requested == "auto":
        return "cpu", None
    if strict:
        raise DeviceError(f"--device {requested}: {reason} (STRICT_DEVICE=true, so no CPU "
                          "fallback)")
    warn(f"WARN: GPU requested but not usable, falling back to CPU ({reason})")
    return "cpu", reason


def get_backend(device: str) -> Backend:
    """The (shared) backend of a device instance: cpu, gpu (= gpu:0) or gpu:N; raises
    DeviceError when it is unusable. Its device and stream become current in the calling
    thread (CuPy's current stream is per thread: a backend first made in another thread would
    otherwise leave this one launching CuPy's kernels on the default stream)."""
    backend = _backend(*parse_device(device))
    backend.make_current()
    return backend


@functools.cache
def _backend(kind: str, index: int) -> Backend:
    if kind == "cpu":
        return Backend()
    reason = gpu_unavailable_reason(index)
    if reason is not None:
        raise DeviceError(f"GPU backend unavailable: {reason}")
    return CupyBackend(index)


def set_threads(threads: int) -> int:
    """Use `threads` cores for BLAS and RustyFlow's own CPU passes (0 = all cores)."""
    n = threads or os.cpu_count() or 1
    devices.set_blas_threads(n)
    get_backend("cpu").kernels.set_threads(n)
    return n


def compute_threads() -> int:
    """Threads RustyFlow's CPU kernels use (its pool splits GEMMs into one-thread BLAS calls
    when it can pin BLAS to one thread; otherwise BLAS threads itself)."""
    return int(get_backend("cpu").kernels.threads)


def cpu_kernels() -> str:
    """Which formulation the CPU's elementwise kernels run (CPU_JIT)."""
    jit = get_backend("cpu").kernels.jit
    return "NumPy" if jit is None else f"numba {jit.VERSION}"


def cpu_description() -> str:
    blas = blas_info()
    return (f"{cpu_name()} ({os.cpu_count()} cores; numpy {np.__version__}, "
            f"{blas['library']}, {compute_threads()} threads, {cpu_kernels()} kernels)")


def devices_report() -> dict[str, Any]:
    """Everything `rustyflow devices` prints: each backend, usable or why not."""
    report: dict[str, Any] = {
        "cpu": {"usable": True, "name": cpu_name(), "cores": os.cpu_count(),
                "numpy": np.__version__, "threads": compute_threads(), "kernels": cpu_kernels(),
                **{f"blas_{k}": v for k, v in blas_info().items()}},
    }
    reason = gpu_unavailable_reason()
    report["gpu"] = {"usable": reason is None, "reason": reason}
    if reason is None:
        report["gpu"].update(gpu_properties())
    return report
