"""The one place that wires the op library's kernel sets into the devices: a backend as the
rest of the package gets it, its kernels made.

It sits above both: the device layer (backend.py) is given a kernel set's class and knows no
op, and the kernel sets (ops/cpu_set.py, ops/cuda_set.py) are given a backend and know no
device's construction, so every import inside the engine runs down.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from ..errors import DeviceError
from .backend import Backend, CupyBackend, cpu_kernels, parse_device
from .devices import blas_info, cpu_name, gpu_properties, gpu_unavailable_reason
from .policy import RunPolicy


def get_backend(device: str, policy: RunPolicy | None = None) -> Backend:
    """The backend of a device instance (cpu, gpu (= gpu:0) or gpu:N) under a run's `policy`
    (None: the default policy, what tests and library calls get); raises DeviceError when it
    is unusable. The device is made once and shared; each policy gets its own view of it
    (Backend.bound). Its device and stream become current in the calling thread (CuPy's
    current stream is per thread: a backend first made in another thread would otherwise
    leave this one launching CuPy's kernels on the default stream)."""
    backend = _device(*parse_device(device))
    if policy is not None:
        backend = backend.bound(policy)
    backend.make_current()
    return backend


@functools.cache
def _device(kind: str, index: int) -> Backend:
    """A device, made once per process (a device is one: its stream, handles and pools), with
    its kind's kernel set. The sets are imported on first use: the CUDA set loads CuPy, which
    a CPU-only process never imports, and importing either runs the ops package's __init__
    (the functional API, above autograd, which imports this module)."""
    if kind == "cpu":
        from .ops.cpu_set import CpuKernels

        return Backend(CpuKernels)
    reason = gpu_unavailable_reason(index)
    if reason is not None:
        raise DeviceError(f"GPU backend unavailable: {reason}")
    from .ops.cuda_set import CudaKernels

    return CupyBackend(CudaKernels, index)


def devices_report() -> dict[str, Any]:
    """Everything `rustyflow devices` prints: each backend, usable or why not."""
    kernels = get_backend("cpu").kernels
    report: dict[str, Any] = {
        "cpu": {"usable": True, "name": cpu_name(), "cores": os.cpu_count(),
                "numpy": np.__version__, "threads": kernels.threads,
                "kernels": cpu_kernels(kernels),
                **{f"blas_{k}": v for k, v in blas_info().items()}},
    }
    reason = gpu_unavailable_reason()
    report["gpu"] = {"usable": reason is None, "reason": reason}
    if reason is None:
        report["gpu"].update(gpu_properties())
    return report
