"""What the machine offers: CPU and BLAS (threads settable at run time), CUDA GPU and CuPy.

BLAS threads are read and set through threadpoolctl, which finds NumPy's BLAS (OpenBLAS, MKL,
BLIS or FlexiBLAS) among the loaded libraries.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import install_command

_BLAS_NAMES = {"openblas": "OpenBLAS", "mkl": "MKL", "blis": "BLIS", "flexiblas": "FlexiBLAS"}


@functools.cache
def numpy_blas() -> Any | None:
    """NumPy's BLAS as threadpoolctl controls it (`set_num_threads`, `num_threads`,
    `internal_api`, `version`), or None when threadpoolctl finds none it can control. Where
    several are loaded (SciPy brings its own), the one shipped inside NumPy comes first."""
    import numpy as np
    from threadpoolctl import ThreadpoolController

    found = ThreadpoolController().select(user_api="blas").lib_controllers
    home = str(Path(np.__file__).resolve().parent)  # a prefix of numpy/ and numpy.libs/
    found.sort(key=lambda c: not str(c.filepath).startswith(home))
    return found[0] if found else None


def blas_info() -> dict[str, Any]:
    """BLAS library name, version and current thread count."""
    blas = numpy_blas()
    if blas is None:
        return {"library": "unknown (not controllable by threadpoolctl)", "threads": None}
    name = _BLAS_NAMES.get(blas.internal_api, blas.internal_api)
    return {"library": f"{name} {blas.version or ''}".strip(), "threads": blas.num_threads}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_time(xp: Any, stream: Any, call: Callable[[], None], reps: int = 5) -> float:
    """Milliseconds per call of `call` on `stream`, after one untimed call (CUDA events; the
    host waits for them: for probes and a GEMM plan's first, eager call, never in a step)."""
    call()
    start, stop = xp.cuda.Event(), xp.cuda.Event()
    start.record(stream)
    for _ in range(reps):
        call()
    stop.record(stream)
    stop.synchronize()
    return xp.cuda.get_elapsed_time(start, stop) / reps


def gpu_capability(index: int | None = None) -> tuple[int, int]:
    """GPU `index`'s compute capability (major, minor); default: the current GPU."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device(index).id)
    return int(props["major"]), int(props["minor"])


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
        "compute_capability": ".".join(map(str, gpu_capability(dev.id))),
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
        if importlib.util.find_spec("nvmath") is None:  # the GEMMs' cuBLAS binding
            return (f"nvmath-python is not installed ({install_command('gpu')} for a CUDA 12 "
                    f"driver, {install_command('cuda13')} for CUDA 13)")
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
