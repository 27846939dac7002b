"""Fused causal attention by cuDNN's SDPA, through NVIDIA's Python frontend
(`nvidia-cudnn-frontend`, import name `cudnn`; the `cudnn` extra): ATTENTION=cudnn, and what
ATTENTION=auto uses for 16-bit runs of a replayed step when it is installed.

Why a second fused attention: flash.py is FlashAttention-2 on `mma.sync`; cuDNN's Hopper
engines use wgmma and TMA, which ours do not, and at GPT-2's shape they are the faster of the
two on an H100 (benchmarks/results/attention-cudnn-h100.md). flash.py stays the portable
kernel: float32 (tf32) runs, attention dropout (cuDNN draws its own random numbers, so its
mask could never be the one `dropout_mask` draws) and machines without cuDNN.

The contract is flash.py's (kernels.py's attention_forward/backward): cuDNN's Stats
(B, H, T, 1) float32 are the natural-log log-sum-exp of the scaled, masked scores, exactly
the lse (B, H, T) flash.py keeps, so the buffer is handed over as it is and a forward of
either implementation can feed the backward of the other. q, k, v, o, do and the gradients
are read and written in place at their own strides (the head-major views of the packed
(B, T, 3E) projection, and of (B, T, E) arrays) when every row is 16-byte aligned
(flash._strides), and copied otherwise.

CUDA graphs: a cuDNN graph is built and planned once per (device, pass, dtype, shape,
strides, scale) and kept for the process, with its workspace allocated once through CuPy (a
captured step's graph refers to it, so plans are never dropped); an execute then binds
pointers and launches on CuPy's current stream, allocating and synchronising nothing, so it
is captured like any kernel. Planning itself cannot be captured, so each shape's first call
must be eager (the trainer's warm-up step is); an unplanned shape inside a capture is an
error, not a broken graph.
"""

from __future__ import annotations

import dataclasses
import functools
from types import ModuleType
from typing import Any

from ....errors import DeviceError, install_command
from ...precision import dtype_name
from .flash import _strides

MAX_HEAD_DIM = 128  # cuDNN's SDPA: head dims that are multiples of 8, up to 128
_IO_TYPE = {"float16": "HALF", "bfloat16": "BFLOAT16"}  # storage dtype -> cudnn.data_type
# the operands' uids in the two cuDNN graphs: an execute maps them to pointers
UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV = range(1, 10)


class CudnnUnavailable(DeviceError):
    """cuDNN's attention cannot run here: the frontend is missing or libcudnn does not load."""


def _install() -> str:
    """How to get the cuDNN frontend: the extra of the driver's CUDA major."""
    return (f"{install_command('cudnn')} (CUDA 12; {install_command('cudnn13')} for CUDA 13), "
            "or ATTENTION=own")


@functools.cache
def load() -> ModuleType:
    """The `cudnn` frontend with its library loaded, or CudnnUnavailable naming the fix (the
    frontend imports without libcudnn and would fail only at its first call)."""
    try:
        import cudnn
    except ImportError as exc:
        raise CudnnUnavailable(f"ATTENTION=cudnn needs NVIDIA's cuDNN frontend, which does "
                               f"not import ({exc}): {_install()}") from exc
    try:
        cudnn.backend_version()
    except Exception as exc:  # RuntimeError: "Unable to find symbol cudnnGetVersion", ...
        raise CudnnUnavailable(f"ATTENTION=cudnn: the cuDNN frontend imports but libcudnn.so.9 "
                               f"does not load ({exc}): {_install()}") from exc
    return cudnn


@functools.cache
def available() -> bool:
    """Whether cuDNN's attention can run in this process (ATTENTION=auto asks)."""
    try:
        load()
    except CudnnUnavailable:
        return False
    return True


def supports(dtype: Any, head_dim: int) -> bool:
    """Whether cuDNN's SDPA takes q, k, v of this dtype and head dim (16-bit inputs only)."""
    try:
        name = dtype_name(dtype)
    except TypeError:
        return False
    return name in _IO_TYPE and head_dim % 8 == 0 and 0 < head_dim <= MAX_HEAD_DIM


def version() -> str:
    """cuDNN's version, for reports ("9.19.0")."""
    v = load().backend_version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


# ---- layouts -----------------------------------------------------------------------------------
def _in_place(a: Any) -> Any:
    """An input as cuDNN reads it: itself when its rows are 16-byte aligned, else a copy."""
    import cupy

    if _strides(a) is not None:
        return a
    a = cupy.ascontiguousarray(a)
    return a if a.data.ptr % 16 == 0 else a.copy()


def _target(out: Any | None, like: Any) -> Any:
    """Where an output is computed: `out` when cuDNN can write it in place, else a fresh
    array (copied into `out` afterwards)."""
    import cupy

    return out if out is not None and _strides(out) is not None else cupy.empty_like(like)


def _settle(out: Any | None, work: Any) -> Any:
    if out is not None and out is not work:
        out[...] = work
        return out
    return work


def _element_strides(a: Any) -> list[int]:
    return [s // a.dtype.itemsize for s in a.strides]


# ---- plans -------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Plan:
    """A built cuDNN graph, the handle it was built with and its workspace (kept for the
    plan's lifetime, so an execute allocates nothing)."""

    graph: Any
    handle: Any
    workspace: Any  # CuPy uint8 array, or None

    def run(self, pointers: dict[int, int]) -> None:
        import cupy

        cudnn = load()
        cudnn.set_stream(self.handle, cupy.cuda.get_current_stream().ptr)
        self.graph.execute(pointers, None if self.workspace is None else self.workspace.data.ptr,
                           handle=self.handle)


_handles: dict[int, Any] = {}  # device id -> cudnn handle
_plans: dict[tuple[Any, ...], _Plan] = {}


def _plan(key: tuple[Any, ...], build: Any) -> _Plan:
    """The plan of `key`, made by `build(cudnn, handle, graph)` on first use."""
    import cupy

    found = _plans.get(key)
    if found is not None:
        return found
    stream = cupy.cuda.get_current_stream()
    if stream.is_capturing():
        raise RuntimeError(f"cuDNN attention: no plan yet for {key[1:4]} while the stream is "
                           f"captured; planning cannot be captured, so run this shape once "
                           f"eagerly first (as the warm-up step does)")
    cudnn = load()
    device = cupy.cuda.Device().id
    handle = _handles.get(device)
    if handle is None:
        handle = _handles[device] = cudnn.create_handle()
    cudnn.set_stream(handle, stream.ptr)
    float32 = cudnn.data_type.FLOAT
    graph = cudnn.pygraph(handle=handle, io_data_type=getattr(cudnn.data_type, _IO_TYPE[key[2]]),
                          intermediate_data_type=float32, compute_data_type=float32)
    build(cudnn, graph)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    size = int(graph.get_workspace_size())
    found = _plans[key] = _Plan(graph, handle,
                                cupy.empty(size, dtype=cupy.uint8) if size else None)
    return found


def _tensors(graph: Any, named: dict[str, tuple[int, Any]]) -> list[Any]:
    """Graph inputs for (uid, array) by name, at the arrays' shapes and strides."""
    return [graph.tensor(name=name, dim=list(a.shape), stride=_element_strides(a),
                         data_type=_io_type(a), uid=uid) for name, (uid, a) in named.items()]


def _io_type(a: Any) -> Any:
    return getattr(load().data_type, _IO_TYPE[dtype_name(a.dtype)])


def _stats(graph: Any, cudnn: ModuleType, lse: Any, tensor: Any = None) -> Any:
    """The lse (B, H, T) as cuDNN's Stats (B, H, T, 1) float32: a graph input, or `tensor`
    (the forward's stats output) marked as the output it is."""
    b, h, t = lse.shape
    dims, strides = [b, h, t, 1], [h * t, t, 1, 1]
    if tensor is None:
        return graph.tensor(name="stats", dim=dims, stride=strides,
                            data_type=cudnn.data_type.FLOAT, uid=UID_STATS)
    tensor.set_uid(UID_STATS).set_output(True).set_dim(dims).set_stride(strides)
    return tensor.set_data_type(cudnn.data_type.FLOAT)


def _output(tensor: Any, uid: int, a: Any) -> None:
    tensor.set_uid(uid).set_output(True).set_dim(list(a.shape))
    tensor.set_stride(_element_strides(a)).set_data_type(_io_type(a))


def _key(direction: str, arrays: tuple[Any, ...], scale: float) -> tuple[Any, ...]:
    import cupy

    q = arrays[0]
    return (cupy.cuda.Device().id, direction, dtype_name(q.dtype), q.shape,
            tuple(a.strides for a in arrays), float(scale))


# ---- the kernels -------------------------------------------------------------------------------
def cudnn_attention_forward(q: Any, k: Any, v: Any, scale: float, out: Any | None = None
                            ) -> tuple[Any, Any]:
    """flash_attention_forward without dropout, by cuDNN: o = softmax_causal(scale q k^T) v
    (B, H, T, D), written into `out` when given, and lse (B, H, T) float32."""
    import cupy

    q, k, v = (_in_place(a) for a in (q, k, v))
    o = _target(out, q)
    lse = cupy.empty(q.shape[:3], dtype=cupy.float32)  # (B, H, T)

    def build(cudnn: ModuleType, graph: Any) -> None:
        tq, tk, tv = _tensors(graph, {"q": (UID_Q, q), "k": (UID_K, k), "v": (UID_V, v)})
        to, stats = graph.sdpa(name="sdpa", q=tq, k=tk, v=tv, attn_scale=scale,
                               generate_stats=True, use_causal_mask=True)
        _output(to, UID_O, o)
        _stats(graph, cudnn, lse, stats)

    _plan(_key("forward", (q, k, v, o), scale), build).run(
        {UID_Q: q.data.ptr, UID_K: k.data.ptr, UID_V: v.data.ptr, UID_O: o.data.ptr,
         UID_STATS: lse.data.ptr})
    return _settle(out, o), lse


def cudnn_attention_backward(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any, scale: float,
                             out: tuple[Any, Any, Any] | None = None) -> tuple[Any, Any, Any]:
    """dq, dk, dv of the forward (cuDNN's or flash.py's: the same lse) for upstream `do`,
    written into `out`'s three arrays when given. cuDNN's dq accumulates with atomics, so
    unlike flash.py's backward the last bits may differ from one run to the next."""
    import cupy

    grads = (None, None, None) if out is None else tuple(out)
    q, k, v, o, do = (_in_place(a) for a in (q, k, v, o, do))
    work = [_target(g, q) for g in grads]
    lse = cupy.ascontiguousarray(lse, dtype=cupy.float32)

    def build(cudnn: ModuleType, graph: Any) -> None:
        tq, tk, tv, to, tdo = _tensors(graph, {
            "q": (UID_Q, q), "k": (UID_K, k), "v": (UID_V, v), "o": (UID_O, o),
            "dO": (UID_DO, do)})
        dq, dk, dv = graph.sdpa_backward(name="sdpa_backward", q=tq, k=tk, v=tv, o=to, dO=tdo,
                                         stats=_stats(graph, cudnn, lse), attn_scale=scale,
                                         use_causal_mask=True)
        for tensor, uid, a in zip((dq, dk, dv), (UID_DQ, UID_DK, UID_DV), work, strict=True):
            _output(tensor, uid, a)

    arrays = (q, k, v, o, do, *work)
    uids = (UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_DQ, UID_DK, UID_DV)
    pointers = {u: a.data.ptr for u, a in zip(uids, arrays, strict=True)}
    _plan(_key("backward", arrays, scale), build).run({**pointers, UID_STATS: lse.data.ptr})
    dq, dk, dv = (_settle(g, w) for g, w in zip(grads, work, strict=True))
    return dq, dk, dv
