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

from ..errors import install_command


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


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_properties(index: int | None = None) -> dict[str, Any]:
    """GPU `index` (default: the current one): name, CUDA versions, memory, capability."""
    import cupy

    dev = cupy.cuda.Device(index)
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    with dev:
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


def gpu_description(index: int | None = None) -> str:
    p = gpu_properties(index)
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


def gpu_unavailable_reason(index: int = 0) -> str | None:
    """Why GPU `index` cannot be used here, or None when it can."""
    if os.environ.get("RUSTYFLOW_DISABLE_GPU"):
        return "RUSTYFLOW_DISABLE_GPU is set"
    try:
        import cupy
    except ImportError:
        return (f"CuPy is not installed ({install_command('gpu')} for a CUDA 12 driver, "
                f"{install_command('cuda13')} for CUDA 13; ./train_gpu.sh picks one itself)")
    except Exception as exc:  # a broken CUDA install raises all sorts at import
        return f"CuPy failed to import: {exc}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        if count <= index:
            return (f"no CUDA device {index} (this machine has {count})" if count else
                    "no CUDA device found")
        with cupy.cuda.Device(index):
            cupy.zeros(1).sum().item()  # proves driver, runtime and kernels agree
    except Exception as exc:
        return f"CUDA is not usable: {type(exc).__name__}: {exc}"
    return None


def gpu_count() -> int:
    """How many CUDA devices this process can use (0 when GPU 0 is not usable)."""
    if gpu_unavailable_reason(0) is not None:
        return 0
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())
