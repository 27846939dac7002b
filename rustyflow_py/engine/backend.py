"""Backends: where a tensor's data lives (NumPy on the CPU, CuPy on an NVIDIA GPU).

A backend is one device instance: the array module (`xp`), its stream and memory, and the
kernel set it is given when made (`kernels`: the op library's, wired in by library.py, the
module above both; this one imports no op set). Ops are written once against `xp`; only the
fused kernels differ between devices. Every host<->device copy of training and evaluation
goes through `to_host`/`from_host` so it can be counted, and `strict_transfers()` turns any
copy inside a block (a training step) into an error. Generation's read-back of the chosen ids
is the one exception: an asynchronous copy into pinned memory behind the sampler
(model/generate.py's IdsToHost, model/graph_decode.py's GraphDraws), not counted.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import os
import resource
import weakref
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import DeviceError, TrainingError
from .devices import blas_info, cpu_name, gpu_description, gpu_properties, gpu_unavailable_reason
from .policy import DEFAULT, RunPolicy

DEVICES = ("cpu", "gpu", "gpu:N")  # "gpu" is GPU 0; "gpu:N" is GPU N (0-based)

KernelSetMaker = Callable[["Backend"], Any]  # a kernel set's class: made over its backend


class TransferError(RuntimeError):
    """A host<->device copy happened while transfers were forbidden."""


@dataclasses.dataclass
class TransferStats:
    """Host<->device copies (counts and bytes each way): a device's since its last reset, or
    those of one `counting_transfers()` block."""

    h2d_count: int = 0
    h2d_bytes: int = 0
    d2h_count: int = 0
    d2h_bytes: int = 0

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def reset(self) -> None:
        self.h2d_count = self.h2d_bytes = self.d2h_count = self.d2h_bytes = 0

    def add(self, direction: str, nbytes: int) -> None:
        if direction == "host->device":
            self.h2d_count += 1
            self.h2d_bytes += nbytes
        else:
            self.d2h_count += 1
            self.d2h_bytes += nbytes


# The caller's transfer rules, scoped to the block that set them (its thread and context):
# whether copies are forbidden, and the counters of the `counting_transfers` blocks open.
_strict: contextvars.ContextVar[bool] = contextvars.ContextVar("strict_transfers",
                                                               default=False)
_counters: contextvars.ContextVar[tuple[TransferStats, ...]] = contextvars.ContextVar(
    "transfer_counters", default=())


@contextlib.contextmanager
def strict_transfers() -> Iterator[None]:
    """Raise TransferError on any host<->device copy inside the block (GPU syncs too)."""
    token = _strict.set(True)
    try:
        yield
    finally:
        _strict.reset(token)


@contextlib.contextmanager
def counting_transfers() -> Iterator[TransferStats]:
    """The host<->device copies made inside the block, on every device (what a test asserts
    a piece of code moves)."""
    stats = TransferStats()
    token = _counters.set((*_counters.get(), stats))
    try:
        yield stats
    finally:
        _counters.reset(token)


def _count(direction: str, nbytes: int, device: TransferStats) -> None:
    """Count a copy for its device and for each open `counting_transfers` block."""
    if _strict.get():
        raise TransferError(
            f"{direction} copy of {nbytes} bytes inside a transfer-free region "
            "(strict mode): keep the data on the device, or move the copy out of the step"
        )
    device.add(direction, nbytes)
    for stats in _counters.get():
        stats.add(direction, nbytes)


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


def _views_of(device: Backend) -> weakref.WeakValueDictionary[RunPolicy, Backend]:
    """A device's views by run policy, held weakly (see Backend.bound); the device is its own
    view under the default policy."""
    views: weakref.WeakValueDictionary[RunPolicy, Backend] = weakref.WeakValueDictionary()
    views[DEFAULT] = device
    return views


class Backend:
    """NumPy backend; the CuPy backend overrides what differs.

    A backend is one device instance: `kind` is "cpu" or "gpu", `name` the instance ("cpu",
    "gpu", "gpu:1", ...), `transfers` its host<->device copies.
    """

    kind = "cpu"

    def __init__(self, kernel_set: KernelSetMaker) -> None:
        self.name, self.index = "cpu", 0
        self.transfers = TransferStats()
        self.xp: ModuleType = np
        self.policy = DEFAULT
        self._views = _views_of(self)
        self.kernels = kernel_set(self)

    def bound(self, policy: RunPolicy) -> Backend:
        """This device under a run's `policy`: a view sharing the device (its array module,
        stream, transfer counts, handles and buffers) whose kernels read `policy`. One view
        per policy while anything holds it (a run, its tensors), so every tensor of a run, and
        of another live run with the same policy, is on one backend; a view nothing holds any
        more is dropped, so the device keeps no view per policy it has ever seen. The device
        itself is never changed by a run."""
        view = self._views.get(policy)
        if view is None:
            view = copy.copy(self)
            view.policy = policy
            try:
                view.kernels = self.kernels.bound(view)
            except RuntimeError as exc:  # CPU_JIT=on without numba
                raise DeviceError(str(exc)) from None
            self._views[policy] = view
        return view

    def prepared(self, say: Callable[[str], None], warn: Callable[[str], None]) -> Backend:
        """This backend with the CPU's numba kernels compiled now rather than inside the first
        step (so compilation never lands in a step or the profile). When numba cannot compile
        them under CPU_JIT=auto, the view under CPU_JIT=off, said with a warning."""
        import time

        jit = self.kernels.jit
        if jit is None:
            return self
        start = time.perf_counter()
        try:
            jit.warm_up()
        except Exception as exc:  # numba installed but unable to compile on this machine
            if self.policy.cpu_jit == "on":
                raise TrainingError(f"CPU_JIT=on, but numba could not compile the CPU kernels "
                                    f"({type(exc).__name__}: {exc}); set CPU_JIT=auto or "
                                    "off to train with the NumPy kernels") from exc
            warn(f"WARN: numba could not compile the CPU kernels ({type(exc).__name__}); "
                 "training with the NumPy kernels (CPU_JIT=off silences this)")
            return self.bound(dataclasses.replace(self.policy, cpu_jit="off"))
        seconds = time.perf_counter() - start
        if seconds > 1.0:
            say(f"numba CPU kernels compiled in {seconds:.1f}s (cached for later runs)")
        return self

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
        return cpu_description(self.kernels)

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

    def __init__(self, kernel_set: KernelSetMaker, index: int = 0) -> None:
        import cupy

        self.name, self.index = device_name("gpu", index), index
        self.transfers = TransferStats()
        self.policy = DEFAULT
        self._views = _views_of(self)
        cupy.cuda.Device(index).use()
        self.xp = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream.use()
        self.kernels = kernel_set(self)
        self.reset_memory_stats()

    def prepared(self, say: Callable[[str], None], warn: Callable[[str], None]) -> Backend:
        """Nothing to compile ahead: the CUDA kernels compile on first use, outside a step."""
        return self

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


def cpu_kernels(kernels: Any) -> str:
    """Which formulation a CPU kernel set's elementwise kernels run (CPU_JIT)."""
    return "NumPy" if kernels.jit is None else f"numba {kernels.jit.VERSION}"


def cpu_description(kernels: Any) -> str:
    """The CPU, its BLAS, and the threads and kernels a CPU kernel set runs."""
    blas = blas_info()
    return (f"{cpu_name()} ({os.cpu_count()} cores; numpy {np.__version__}, "
            f"{blas['library']}, {kernels.threads} threads, {cpu_kernels(kernels)} kernels)")
