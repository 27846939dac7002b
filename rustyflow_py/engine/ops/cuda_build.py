"""Compiling the ops' CUDA C: every kernel's source is a `.cu` file beside the Python that
launches it, and this module is the one place that reads, configures and compiles them.

- `source(folder_file, "name.cu")` declares a launcher's file (at import: a missing file is an
  error then, and tests/test_cuda_sources.py checks that every .cu file has a launcher).
- Shared device code (Philox, warp reductions, the storage/accumulation types) lives in
  `cuda_include/*.cuh`. `read` inlines a file's `#include "x.cuh"` lines itself rather than
  handing NVRTC an include path: CuPy's kernel cache is keyed by the source text and the
  options, not by the headers a source includes, so an edited header would otherwise reuse a
  stale binary.
- A source compiled per storage dtype gets its types as macros (`dtype_defines`): `real`, the
  type it loads and stores, and `acc`, the type it computes and reduces in (float32 for
  16-bit types, float64 for float64).
- `OPTIONS` holds each file's compiler options; a file not named there takes CuPy's defaults.

Nothing here imports CuPy until a kernel is compiled, so every launcher imports without it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..precision import accumulate_dtype

INCLUDE_DIR = Path(__file__).resolve().parent / "cuda_include"
# Compiler options by .cu file name (the flash-style attention uses C++17's constexpr if).
OPTIONS: dict[str, tuple[str, ...]] = {"flash_attention.cu": ("--std=c++17",)}
_INCLUDE = re.compile(r'^#include "([\w.]+)"$', re.MULTILINE)
# Storage dtype name -> (real, the macro that includes its header)
_REAL = {"float32": ("float", ""), "float64": ("double", ""), "float16": ("__half", "RF_FP16"),
         "bfloat16": ("__nv_bfloat16", "RF_BF16")}
SOURCES: list[CudaSource] = []  # every declared file (tests compile them all)
WARPS_PER_BLOCK = 8  # blocks of the one-warp-per-row kernels
VEC_BYTES = 16  # cuda_include/vec.cuh's vector
VEC_THREADS = 256  # blocks of the kernels over vectors, one vector a thread


@dataclasses.dataclass(frozen=True)
class CudaSource:
    """One .cu file and how its launcher compiles it. `sample` is a set of macros with which
    the file compiles on its own (the GPU test compiles every file with them)."""

    path: Path
    sample: tuple[str, ...] = ()

    @property
    def options(self) -> tuple[str, ...]:
        return OPTIONS.get(self.path.name, ())

    def text(self) -> str:
        return read(self.path)

    def kernel(self, name: str, defines: tuple[str, ...] = ()) -> Any:
        """The RawKernel `name` of this file's module with `defines`."""
        return _function(self.path, self.options + defines, name)

    def typed(self, name: str, dtype: Any, *same: Any, defines: tuple[str, ...] = ()) -> Any:
        """Kernel `name` compiled for storage `dtype`. It reads raw pointers, so the arrays
        in `same` are checked to be of that dtype: another would be read as garbage."""
        for a in same:
            if a.dtype != dtype:
                raise TypeError(f"{name}: {a.dtype} array where the kernel takes {dtype}")
        return _typed(self, name, dtype, defines)


def source(launcher: str, name: str, sample: tuple[str, ...] = ()) -> CudaSource:
    """Declare the .cu file `name` in the folder of the module file `launcher`."""
    path = Path(launcher).resolve().parent / name
    if not path.is_file():
        raise FileNotFoundError(f"CUDA source {path} is missing")
    found = CudaSource(path, sample)
    SOURCES.append(found)
    return found


def read(path: Path) -> str:
    """The text of a .cu or .cuh file with its `#include "x.cuh"` lines replaced by the
    headers from cuda_include/ (each header at most once per source)."""
    seen: set[str] = set()

    def inline(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return ""
        seen.add(name)
        return _INCLUDE.sub(inline, (INCLUDE_DIR / name).read_text())

    return _INCLUDE.sub(inline, Path(path).read_text())


@functools.cache
def dtype_defines(dtype: Any) -> tuple[str, ...]:
    """The -D options that make `real` the storage dtype and `acc` its accumulation type
    (cuda_include/types.cuh); bfloat16 is looked up by name, so no ml_dtypes is needed.
    Cached: `typed` asks on every launch, and a dtype's name is a slow NumPy property."""
    dtype = np.dtype(dtype)
    real, header = _REAL[dtype.name]
    acc = "double" if accumulate_dtype(dtype) == np.float64 else "float"
    return (f"-DRF_REAL={real}", f"-DRF_ACC={acc}") + ((f"-D{header}=1",) if header else ())


@functools.cache
def _typed(src: CudaSource, name: str, dtype: Any, defines: tuple[str, ...]) -> Any:
    """`CudaSource.typed`'s kernel, kept per key: it is looked up on every launch, and
    building its options (two tuple concatenations) and hashing them each time is host work
    an eager step repeats a hundred times."""
    return src.kernel(name, dtype_defines(dtype) + defines)


@functools.cache
def _module(path: Path, options: tuple[str, ...]) -> Any:
    import cupy

    return cupy.RawModule(code=read(path), options=options)


@functools.cache
def _function(path: Path, options: tuple[str, ...], name: str) -> Any:
    return _module(path, options).get_function(name)


def elementwise(src: CudaSource, in_params: str, out_params: str, call: str,
                name: str) -> Any:
    """A cupy.ElementwiseKernel whose operation `call` calls a device function of `src`
    (its preamble), compiled with `src`'s options."""
    import cupy

    return cupy.ElementwiseKernel(in_params, out_params, call, name, preamble=src.text(),
                                  **_options(src))


def acc_scalar(value: float, dtype: Any) -> Any:
    """A scalar argument in the acc type of storage `dtype`."""
    return accumulate_dtype(dtype).type(value)


def warp_grid(rows: int, per_block: int = WARPS_PER_BLOCK) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) of a kernel that runs one warp per row, `per_block` warps a block."""
    return (-(-rows // per_block),), (32 * per_block,)


def vectors(*arrays: Any) -> int:
    """How many 16-byte vectors (vec.cuh) a kernel over whole vectors may take `arrays` as,
    or 0 when it may not: arrays of one float dtype and one shape, C-contiguous, 16-byte
    aligned, a whole number of vectors long."""
    first = arrays[0]
    per = per_vector(first.dtype)
    if (not per or first.size % per
            or any(a.dtype != first.dtype or a.shape != first.shape or not a.flags.c_contiguous
                   or a.data.ptr % VEC_BYTES for a in arrays)):
        return 0
    return first.size // per


@functools.cache
def per_vector(dtype: Any) -> int:
    """Values of `dtype` in a vector, 0 for a dtype the kernels are not compiled for. Cached:
    `vectors` asks on every add and GELU backward, and a dtype's name is a slow property."""
    dtype = np.dtype(dtype)
    return VEC_BYTES // dtype.itemsize if dtype.name in _REAL else 0


def vector_grid(vecs: int) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) of a kernel over `vecs` vectors, one a thread."""
    return (-(-vecs // VEC_THREADS),), (VEC_THREADS,)


def _options(src: CudaSource) -> dict[str, Any]:
    """CuPy's keyword for the options, only when there are any (the defaults otherwise)."""
    return {"options": src.options} if src.options else {}


def kernel_cache_files() -> int:
    """How many compiled kernels CuPy's on-disk cache holds (0 while it does not exist): a
    count that grows during a step means its kernels were compiled (a cold cache)."""
    # CuPy's documented cache location: CUPY_CACHE_DIR, else ~/.cupy/kernel_cache
    folder = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
    return sum(len(files) for _, _, files in os.walk(folder)) if os.path.isdir(folder) else 0
