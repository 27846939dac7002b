"""The device's limits for the roofline: peak FLOP/s per compute type and memory bandwidth.

Known GPUs come from a table of NVIDIA's published dense (no-sparsity) figures; any other GPU,
and the CPU, get a short measured probe instead (a GEMM, and on the GPU a device-to-device
copy), and the record says which (`source`). A probe is a floor on the true peak, so shares of
it read high; a table figure is a ceiling no kernel quite reaches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .devices import device_time

# name fragment -> (dense TFLOP/s by compute type, memory GB/s); the first match wins, so the
# more specific fragments come first
KNOWN_GPUS: tuple[tuple[str, dict[str, float], float], ...] = (
    ("H200", {"fp64": 67.0, "fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4,
              "fp8": 1978.9}, 4800.0),
    ("H100 PCIe", {"fp64": 51.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0,
                   "fp8": 1513.0}, 2000.0),
    ("H100", {"fp64": 67.0, "fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4,
              "fp8": 1978.9}, 3350.0),
    ("A100-SXM4-80GB", {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0,
                        "fp16": 312.0}, 2039.0),
    ("A100", {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, 1555.0),
    ("L4", {"fp64": 0.5, "fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0,
            "fp8": 242.5}, 300.0),
)

_COMPUTE = {"bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def compute_type(dtype: str, precision: str) -> str:
    """The peak a GEMM with inputs of `dtype` is held to: float32 GEMMs run on TF32 tensor
    cores when the run's PRECISION is tf32, else on the float32 units; bfloat16 GEMMs run in
    FP8 when it is fp8 (the few FP8 cannot take are held to the FP8 peak too)."""
    if dtype == "bfloat16" and precision == "fp8":
        return "fp8"
    if dtype in _COMPUTE:
        return _COMPUTE[dtype]
    return "tf32" if precision == "tf32" else "fp32"


# parts the fragments would match but whose peaks differ from the row they match (the H100
# and H200 rows are the SXM parts; NVL cards run lower clocks and power): measured instead
NOT_IN_TABLE = ("NVL",)


def lookup(name: str) -> dict[str, Any] | None:
    """The table's entry for a GPU name (None if it is not in the table)."""
    if any(fragment in name for fragment in NOT_IN_TABLE):
        return None
    for fragment, tflops, gbs in KNOWN_GPUS:
        if fragment in name:
            return {"source": f"table ({fragment}, dense)", "tflops": dict(tflops),
                    "bandwidth_gbs": gbs}
    return None


def of(backend: Any, dtype: Any, precision: str, cpu_gflops: float | None = None
       ) -> dict[str, Any]:
    """The limits of `backend`'s device for a run of PRECISION `precision`: from the table for
    a known GPU, else measured; on the CPU, `cpu_gflops` (the GEMM rate the run measured for
    its matmul floor, record.measure_gemm_gflops; no peak without it)."""
    if backend.kind != "gpu":
        tflops = ({compute_type(np.dtype(dtype).name, precision): cpu_gflops / 1e3}
                  if cpu_gflops is not None else {})
        return {"source": "measured (this machine's BLAS GEMM)", "tflops": tflops,
                "bandwidth_gbs": None}
    known = lookup(backend.hardware())
    if known is not None:
        return known
    return probe_gpu(backend, dtype, precision)


def probe_gpu(backend: Any, dtype: Any, precision: str, n: int = 4096,
               reps: int = 10) -> dict[str, Any]:
    """A GPU not in the table: a square GEMM in the run's compute dtype (through the run's own
    GEMM, so in its compute mode) and one large copy, timed by events: floors on the peaks."""
    xp = backend.xp
    a = xp.ones((n, n), dtype=dtype)
    seconds = _timed(backend, lambda: backend.kernels.matmul(a, a), reps)
    src = xp.ones(64 * 2**20, dtype=np.float32)  # 256 MiB
    dst = xp.empty_like(src)
    copy_s = _timed(backend, lambda: dst.__setitem__(Ellipsis, src), reps)
    return {"source": "measured probe (GPU not in the table)",
            "tflops": {compute_type(np.dtype(dtype).name, precision): 2.0 * n**3 / seconds / 1e12},
            "bandwidth_gbs": 2 * src.nbytes / copy_s / 1e9}


def _timed(backend: Any, fn: Any, reps: int) -> float:
    """Seconds per call of `fn` on the backend's stream."""
    return device_time(backend.xp, backend.stream, fn, reps) / 1e3
