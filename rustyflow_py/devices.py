"""What the machine offers: CPU and BLAS (threads settable at run time), CUDA GPU and CuPy.

BLAS threads are set through OpenBLAS's own C entry points found in the loaded libraries
(the mechanism threadpoolctl uses), so no extra dependency is needed.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from typing import Any

import numpy as np

from .backend import gpu_unavailable_reason


@functools.cache
def openblas() -> tuple[Any, str] | None:
    """The loaded OpenBLAS library and its symbol prefix/suffix, if NumPy uses OpenBLAS."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_", "64_"), ("", "64_"), ("scipy_", ""), ("", "")):
            if hasattr(lib, f"{prefix}openblas_get_num_threads{suffix}"):
                return lib, f"{prefix}openblas_%s{suffix}"
    return None


def blas_info() -> dict[str, Any]:
    """BLAS library name, version and current thread count."""
    found = openblas()
    if found is None:
        return {"library": "unknown (not OpenBLAS)", "threads": None}
    lib, pattern = found
    get_config = getattr(lib, pattern % "get_config")
    get_config.restype = ctypes.c_char_p
    return {
        "library": " ".join(get_config().decode().split()[:2]),
        "threads": int(getattr(lib, pattern % "get_num_threads")()),
    }


def set_threads(threads: int) -> int:
    """Use `threads` cores for BLAS and RustyFlow's own parallel passes (0 = all cores)."""
    from .backend import get_backend

    n = threads or os.cpu_count() or 1
    found = openblas()
    if found is not None:
        lib, pattern = found
        getattr(lib, pattern % "set_num_threads")(ctypes.c_int(n))
    get_backend("cpu").fused.set_threads(n)
    return n


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def compute_threads() -> int:
    """Threads RustyFlow's CPU kernels use (its pool splits GEMMs into one-thread BLAS calls
    when it can pin BLAS to one thread; otherwise BLAS threads itself)."""
    from .backend import get_backend

    return int(get_backend("cpu").fused.threads)


def cpu_kernels() -> str:
    """Which formulation the CPU's elementwise kernels run (CPU_JIT)."""
    from .backend import get_backend

    jit = get_backend("cpu").fused.jit
    return "NumPy" if jit is None else f"numba {jit.VERSION}"


def cpu_description() -> str:
    blas = blas_info()
    return (f"{cpu_name()} ({os.cpu_count()} cores; numpy {np.__version__}, "
            f"{blas['library']}, {compute_threads()} threads, {cpu_kernels()} kernels)")


def gpu_properties() -> dict[str, Any]:
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    free, total = cupy.cuda.runtime.memGetInfo()
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    driver = cupy.cuda.runtime.driverGetVersion()
    return {
        "name": props["name"].decode(),
        "cuda_runtime": f"{runtime // 1000}.{runtime % 1000 // 10}",
        "cuda_driver": f"{driver // 1000}.{driver % 1000 // 10}",
        "cupy": cupy.__version__,
        "memory_total": total,
        "memory_free": free,
        "compute_capability": f"{props['major']}.{props['minor']}",
    }


def gpu_description() -> str:
    p = gpu_properties()
    return (f"{p['name']} (CUDA {p['cuda_runtime']}, CuPy {p['cupy']}, "
            f"{p['memory_total'] / 2**30:.1f} GiB)")


def gpu_memory_line() -> str:
    """The GPU's memory now, for out-of-memory messages."""
    try:
        p = gpu_properties()
    except Exception as exc:  # the error being reported may have broken the context too
        return f"GPU memory could not be read ({type(exc).__name__})"
    return (f"{p['name']}: {p['memory_free'] / 2**30:.2f} GiB free of "
            f"{p['memory_total'] / 2**30:.2f} GiB")


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
