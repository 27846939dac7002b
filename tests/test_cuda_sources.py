"""The ops' CUDA C lives in .cu files beside its launchers (engine/ops/cuda_build.py).

On the CPU: no Python string in the package holds CUDA C; every .cu file is declared by a
launcher and every declared file exists; every header a source includes exists and every
header is used; every kernel and device function the launchers name is defined in the CUDA
C; and gelu.cuh's constants are the reference's. On a GPU: every .cu file compiles through
cupy.RawModule with its launcher's options.
"""

from __future__ import annotations

import ast
import importlib
import math
import pkgutil
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from rustyflow_py.engine import ops
from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.ops import cuda_build
from rustyflow_py.engine.ops.gelu.reference import GELU_C, GELU_K

PACKAGE = Path(__file__).resolve().parents[1] / "rustyflow_py"
OPS = Path(ops.__file__).resolve().parent
# What only CUDA C says: declarations, qualifiers, the preprocessor.
CUDA_C = re.compile(r'__global__|__device__|__shared__|extern "C"|__syncthreads|\btypedef\b'
                    r"|\(T\)|^\s*#\s*(include|define|if|pragma)\b", re.MULTILINE)
# An ElementwiseKernel's operation: one call of a .cu file's device function, nothing more.
ONE_CALL = re.compile(r"^(\w+ = )?rf_\w+(<[\w, ]+>)?\([\w, ]*\)$")
# Where the operation is among the arguments of cupy.ElementwiseKernel, cuda_build.elementwise
# and its alias in optim/cuda.py.
OPERATION_ARG = {"ElementwiseKernel": 2, "elementwise": 3, "ew": 3}


def _modules() -> list[object]:
    """Every module of the op library, imported (so every launcher has declared its file),
    but the numba kernels (optional: each folder's jit.py, and what loads and compiles them)."""
    names = [m.name for m in pkgutil.walk_packages(ops.__path__, ops.__name__ + ".")]
    numba = (".cpu_jit", ".jit_compile", ".jit")
    return [importlib.import_module(n) for n in names if not n.endswith(numba)]


def _text(node: ast.expr) -> str | None:
    """A string literal or f-string's text (each formatted value as `x`), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
    return None


def cuda_strings(code: str) -> list[str]:
    """The string literals of a Python module that hold CUDA C (docstrings aside), and the
    operations of its ElementwiseKernels that do more than call one device function."""
    tree = ast.parse(code)
    ops = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            at = OPERATION_ARG.get(ast.unparse(node.func).rsplit(".", 1)[-1])
            text = _text(node.args[at]) if at is not None and len(node.args) > at else None
            if text is not None and not ONE_CALL.match(text):
                ops.append(text)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return ops + [node.value for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings and CUDA_C.search(node.value)]


def test_the_check_finds_cuda_c_in_a_string() -> None:
    kernel = 'K = r"""\nextern "C" __global__ void k(float* x) { x[0] = 1; }\n"""\n'
    body = 'k = cupy.ElementwiseKernel("T x", "T y", "y = x + 1; y *= 2", "k")\n'
    assert cuda_strings(kernel) and cuda_strings(body)
    call = 'k = cuda_build.elementwise(SRC, "T x, T b", "T y", "y = rf_gelu_forward(x, b)", "k")'
    assert cuda_strings(call + "\n") == []


def test_no_cuda_c_in_python_strings() -> None:
    found = {str(p.relative_to(PACKAGE)): cuda_strings(p.read_text())
             for p in PACKAGE.rglob("*.py")}
    assert {path: hits for path, hits in found.items() if hits} == {}


def test_every_cu_file_has_a_launcher_and_every_launcher_its_file() -> None:
    _modules()
    declared = {s.path for s in cuda_build.SOURCES}
    on_disk = set(OPS.rglob("*.cu"))
    assert on_disk and declared == on_disk, (declared ^ on_disk)
    assert all(p.is_file() for p in declared)


def test_a_missing_cu_file_is_an_error_at_import() -> None:
    with pytest.raises(FileNotFoundError, match="nothing.cu"):
        cuda_build.source(str(OPS / "gelu" / "cuda.py"), "nothing.cu")


def test_every_header_exists_and_is_used() -> None:
    _modules()
    included = set()
    for path in [*OPS.rglob("*.cu"), *OPS.rglob("*.cuh")]:
        included |= set(re.findall(r'^#include "([\w.]+)"$', path.read_text(), re.MULTILINE))
    headers = {p.name for p in cuda_build.INCLUDE_DIR.glob("*.cuh")}
    assert included == headers
    for src in cuda_build.SOURCES:
        assert '#include "' not in src.text()  # every include inlined


def test_a_header_that_names_the_storage_types_brings_them() -> None:
    """A header using `real` or `acc` includes types.cuh (itself, or through a header it
    includes), so it compiles whatever a source includes before it (vec.cuh once did not,
    and layernorm_fp8.cu, which included it first, failed to compile)."""
    for header in cuda_build.INCLUDE_DIR.glob("*.cuh"):
        code = re.sub(r"//[^\n]*", "", header.read_text())
        if header.name != "types.cuh" and re.search(r"\b(real|acc)\b", code):
            assert "typedef RF_REAL real;" in cuda_build.read(header), header.name


def test_every_kernel_and_device_function_a_launcher_names_is_defined() -> None:
    """Kernels launched as SRC.typed("name", ...) exist in SRC's file; every rf_* function an
    ElementwiseKernel's operation calls is defined in the CUDA C."""
    modules = _modules()  # imported first: importing a launcher declares its source
    everything = "".join(s.text() for s in cuda_build.SOURCES)
    checked = 0
    for module in modules:
        code = Path(module.__file__).read_text()
        for var, name in re.findall(r'(\w+)\.typed\(\s*"(\w+)"', code):
            text = getattr(module, var).text()
            launch_bounds = r"(?:__launch_bounds__\([^)]*\) )?"
            assert re.search(rf'extern "C" __global__ void {launch_bounds}{name}\(', text), (
                var, name)
            checked += 1
        for name in re.findall(r'"(?:\w+ = )?(rf_\w+)(?:<T>)?\(', code):
            assert re.search(rf"\b{name}\(", everything), name
            checked += 1
    assert checked > 20


def test_gelu_cuh_constants_are_the_references() -> None:
    text = (cuda_build.INCLUDE_DIR / "gelu.cuh").read_text()
    assert set(re.findall(r"\(A\)(0\.\d+)", text)) == {repr(GELU_C), repr(GELU_K), "0.5"}
    assert GELU_C == math.sqrt(2.0 / math.pi)


def test_dtype_defines() -> None:
    import numpy as np

    assert cuda_build.dtype_defines(np.float32) == ("-DRF_REAL=float", "-DRF_ACC=float")
    assert cuda_build.dtype_defines(np.float64) == ("-DRF_REAL=double", "-DRF_ACC=double")
    assert cuda_build.dtype_defines(np.float16) == ("-DRF_REAL=__half", "-DRF_ACC=float",
                                                    "-DRF_FP16=1")


def test_which_arrays_the_vector_kernels_take() -> None:
    """cuda_build.vectors on stand-ins for device arrays (what it reads of them: dtype, shape,
    size, contiguity and the pointer): whole 16-byte vectors of one float dtype and shape,
    aligned and contiguous, else 0 (the caller then takes CuPy's kernel)."""
    import numpy as np

    def arr(dtype: object, shape: tuple[int, ...], ptr: int = 256, contiguous: bool = True
            ) -> SimpleNamespace:
        return SimpleNamespace(dtype=np.dtype(dtype), shape=shape, size=math.prod(shape),
                               flags=SimpleNamespace(c_contiguous=contiguous),
                               data=SimpleNamespace(ptr=ptr))

    vectors = cuda_build.vectors
    assert vectors(arr(np.float32, (3, 40)), arr(np.float32, (3, 40))) == 30
    assert vectors(arr(np.float64, (3, 40))) == 60 and vectors(arr(np.float16, (3, 40))) == 15
    assert vectors(arr(np.float32, (3, 41))) == 0  # not whole vectors
    assert vectors(arr(np.float32, (3, 40)), arr(np.float32, (40,))) == 0  # broadcasting
    assert vectors(arr(np.float32, (3, 40)), arr(np.float64, (3, 40))) == 0  # mixed dtypes
    assert vectors(arr(np.float32, (3, 40)), arr(np.float32, (3, 40), ptr=260)) == 0
    assert vectors(arr(np.float32, (3, 40), contiguous=False)) == 0
    assert vectors(arr(np.int32, (3, 40))) == 0  # no kernel compiled for it


@pytest.mark.gpu
@pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))
@pytest.mark.parametrize("name", sorted({p.name for p in OPS.rglob("*.cu")}))
def test_every_cu_file_compiles(name: str) -> None:
    import cupy

    _modules()
    (src,) = [s for s in cuda_build.SOURCES if s.path.name == name]
    module = cupy.RawModule(code=src.text(), options=src.options + src.sample)
    module.compile()
    for kernel in re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s*)?'
                             r"(\w+)\(", src.text()):
        assert module.get_function(kernel) is not None
