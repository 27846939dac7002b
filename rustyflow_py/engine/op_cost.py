"""What an op call costs in work: GEMM FLOPs and shapes, and the bytes an op reads and writes.

These place each op on a roofline (achieved FLOP/s against the peak for its dtype, achieved
bytes/s against the memory bandwidth). They are counted at the op boundary, from the arrays
themselves, so they need no knowledge of the kernels:

- a GEMM C = A @ B (batched or not; B possibly transposed) does 2 * C.size * K multiply-adds'
  worth of FLOPs, with K = A.shape[-1]: every product in the engine passes A first (see
  Function.matmul and Function.gemm);
- an op's bytes are its input and output arrays plus, for a backward, the arrays the op saved
  in forward, each counted once: an estimate of its memory traffic (a kernel that re-reads
  moves more; a gather that reads a few rows of a table moves less).
"""

from __future__ import annotations

from typing import Any


def _arrays(values: Any) -> list[Any]:
    """The arrays among `values` (one value, or a tuple/list of them)."""
    items = values if isinstance(values, tuple | list) else (values,)
    return [v for v in items if hasattr(v, "nbytes") and hasattr(v, "shape")]


def gemm_cost(a: Any, out: Any) -> tuple[float, tuple[int, int, int, int], str] | None:
    """(FLOPs, (batch, M, N, K), dtypes) of the product A @ B -> out (out may be a tuple whose
    first array is the product, as the fused Linear kernels return); None if not arrays."""
    arrays = _arrays(out)
    if not arrays or not hasattr(a, "shape") or not a.shape:
        return None
    c = arrays[0]
    if c.ndim == 0:
        return None
    n, k = c.shape[-1], a.shape[-1]
    m = c.shape[-2] if c.ndim >= 2 else 1
    batch = c.size // max(m * n, 1)
    dtypes = f"{a.dtype}->{c.dtype}"
    return 2.0 * c.size * k, (batch, m, n, k), dtypes


def _state(obj: Any) -> tuple[Any, ...]:
    """An object's attribute values, from its __dict__ or its __slots__."""
    if hasattr(obj, "__dict__"):
        return tuple(vars(obj).values())
    return tuple(getattr(obj, n) for n in getattr(type(obj), "__slots__", ()) if hasattr(obj, n))


def op_bytes(args: tuple[Any, ...], out: Any, saved_by: Any = None) -> int:
    """Bytes of the arrays an op call reads and writes: its arguments, its outputs and the
    arrays held by `saved_by` (a backward's Function, a row gradient), each counted once."""
    seen: dict[int, int] = {}
    candidates = [*_arrays(args), *_arrays(out)]
    if saved_by is not None:
        candidates += _arrays(_state(saved_by))
    for a in candidates:
        seen[id(a)] = int(a.nbytes)
    return sum(seen.values())
