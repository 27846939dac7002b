"""The kernel table: (op, device kind, dtype) -> the class whose method runs that kernel.

Each op folder declares its kernels once (its `kernels.py`: the contract in the docstring, one
`declare` call per op), kernel_table.py imports every folder's declaration, and a device's
kernel set (`backend.kernels`, a `KernelSet`) looks each call up here by the op's name, the
set's kind ("reference", "cpu" or "gpu") and the dtype of the call's first array (a state
tuple handed back to a backward is searched depth-first; an op with no array argument, such
as `dropout_mask`, is looked up under ANY). A missing entry is a `KernelNotFound` naming all
three. Which class runs is therefore written down, not found by walking base classes.

The classes are an op family's kernels on one device (`Family`): a device's class extends
its family's reference class (same folder) and overrides what pays. One instance per class
and kernel set holds that family's caches. What else a class needs is declared on it, by
name, and handed to each instance when its kernel set makes it: `uses`, the kernel set's
state and helpers (the CPU's thread pool, the GPU's cuBLAS handle, what the run policy
decided; each set lists what it `offers`), and `calls`, the other ops it runs (through the
set's dispatchers, so the table picks their kernels too). Declarations add up along a
class's bases, and what is handed over is a plain attribute of the instance: a kernel
reads it as cheaply as its own. A name neither declared nor defined is an AttributeError
(tests/test_kernel_declarations.py reads every family's source for such names), and one a
set does not offer fails when that set makes the family.

A kernel set belongs to one view of its device under one run policy (engine/policy.py): what
the policy decides (ATTENTION and LM_HEAD_CHUNK here; threads and CPU_JIT on the CPU, the
GEMM compute mode and cuBLASLt's epilogues on the GPU) is read into plain attributes once,
when the set is made or bound to another view (`bound`), and never set afterwards. A bound
set shares the device's handles, caches and buffers, and makes its own family instances and
dispatchers (made from it, so they see its policy).

Common rules of every kernel (each op folder's kernels.py has its own contract). Arrays live
on the set's device. Float arrays share one storage dtype (float32 for training, float64 for
gradient checks, float16/bfloat16 for mixed precision) and results keep it; kernels
accumulate in float32 (float64 for float64), and the statistics they hand back (LayerNorm
mean/rstd, log-sum-exps, losses) are float32 for 16-bit inputs. Integer arrays (targets,
indices, tokens) are int32 or int64. Nothing reads a value back to the host or synchronizes,
so a training step can be captured as a CUDA graph: scalars that change from step to step
(learning rate, step counter, clip scale) are 0-d device arrays. Arguments are not modified
unless the contract says so. A "state" that a forward returns is opaque to callers: hand it
to the matching backward, once, and do not look inside (each device keeps what its own
backward needs, and it may alias the forward's buffers).

A backward kernel that takes `into` arrays (a parameter's gradient buffer, from
Function.grad_buffers: C-contiguous, the gradient's shape, in the accumulation dtype) adds that
gradient into it and returns None in its place (`add_into`), so a GEMM can add with beta = 1
and a reduction in its last pass, with no temporary and no pass of its own per parameter.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

from ...errors import DeviceError
from ..policy import RunPolicy

ANY = "any"  # the entry for calls whose first array has no entry of its own dtype
F32, F64, F16, BF16 = "float32", "float64", "float16", "bfloat16"
FLOATS = (F32, F64, F16, BF16)
SIXTEEN = (F16, BF16)
KINDS = ("reference", "cpu", "gpu")
_TABLE: dict[tuple[str, str, str], type[Family]] = {}


class KernelNotFound(DeviceError):
    """No kernel is declared for this (op, device kind, dtype)."""


class Family:
    """An op family's kernels on one device (see the module docstring)."""

    uses: tuple[str, ...] = ()  # the kernel set's state and helpers this class reads
    calls: tuple[str, ...] = ()  # the other ops it runs, through the set's dispatchers
    taken: tuple[str, ...] = ()  # both, along the class's bases: what each instance receives

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        taken = dict.fromkeys((*declared(cls, "uses"), *declared(cls, "calls")))
        defined = [name for name in taken if hasattr(cls, name)]
        if defined:  # the instance's attribute would hide the class's own
            raise TypeError(f"{cls.__name__} defines {', '.join(defined)}, which it also "
                            "declares it takes from its kernel set")
        cls.taken = tuple(taken)

    def __init__(self, kernels: KernelSet) -> None:
        self.xp = kernels.xp
        self.backend = kernels.backend
        for name in self.taken:
            setattr(self, name, getattr(kernels, name))


def declared(cls: type[Family], what: str) -> tuple[str, ...]:
    """The names a family class declares in `what` ("uses" or "calls"), its bases' too."""
    return tuple(dict.fromkeys(name for base in reversed(cls.__mro__)
                               for name in vars(base).get(what, ())))


def unmet(cls: type[Family], offers: Iterable[str]) -> list[str]:
    """What `cls` declares that a kernel set offering `offers` cannot give it: helpers the
    set does not offer, and calls of ops the table does not know."""
    known = set(ops())
    return ([name for name in declared(cls, "uses") if name not in offers]
            + [name for name in declared(cls, "calls") if name not in known])


def add_into(into: Any, value: Any) -> Any:
    """`value`, or None once it is added into `into` when that is given (the reference's way
    of honouring an `into` argument; fused kernels add inside their own passes)."""
    if into is None:
        return value
    into += value
    return None


def declare(ops: str | Iterable[str], **kinds: dict[str | tuple[str, ...], type[Family]]
            ) -> None:
    """Enter op(s) in the table: for each device kind, {dtype or dtypes: class}. Declaring
    one (op, kind, dtype) twice is an error: the table has one answer per key."""
    for op in [ops] if isinstance(ops, str) else ops:
        for kind, by_dtype in kinds.items():
            if kind not in KINDS:
                raise ValueError(f"{op}: unknown device kind {kind!r} (not one of {KINDS})")
            for dtypes, cls in by_dtype.items():
                for dtype in (dtypes,) if isinstance(dtypes, str) else dtypes:
                    if (op, kind, dtype) in _TABLE:
                        raise ValueError(f"{op} on {kind} for {dtype} is declared twice")
                    if not callable(getattr(cls, op, None)):
                        raise ValueError(f"{cls.__name__} has no kernel {op}")
                    _TABLE[(op, kind, dtype)] = cls


def entries() -> dict[tuple[str, str, str], type[Family]]:
    """The whole table (a copy)."""
    return dict(_TABLE)


def ops() -> list[str]:
    """Every op the table knows."""
    return sorted({op for op, _, _ in _TABLE})


def lookup(op: str, kind: str, dtype: str) -> type[Family]:
    """The class that runs `op` on a `kind` device for `dtype` (a dtype's name, or ANY)."""
    cls = _TABLE.get((op, kind, dtype)) or _TABLE.get((op, kind, ANY))
    if cls is None:
        have = sorted(d for o, k, d in _TABLE if o == op and k == kind)
        raise KernelNotFound(
            f"no kernel for op {op!r} on device kind {kind!r} for dtype {dtype}"
            + (f" (declared for {', '.join(have)})" if have else " (none declared for it)")
            + ": declare one in the op folder's kernels.py")
    return cls


def _dtype_of(args: tuple[Any, ...]) -> Any:
    """The dtype of the first array among args (tuples searched depth-first), or None."""
    for a in args:
        if isinstance(a, tuple):
            found = _dtype_of(a)
            if found is not None:
                return found
        elif not isinstance(a, type) and getattr(a, "dtype", None) is not None:
            return a.dtype  # an array (or a NumPy scalar); a dtype or a scalar type is not
    return None


class _Dispatch:
    """backend.kernels.<op>: the call looked up by its first array's dtype (then cached)."""

    __slots__ = ("_cache", "_op", "_set")

    def __init__(self, kernels: KernelSet, op: str) -> None:
        self._set, self._op = kernels, op
        self._cache: dict[Any, Callable[..., Any]] = {}  # by the call's dtype (None: ANY)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:  # the usual call: an array first, its dtype seen before
            fn = self._cache[args[0].dtype]
        except (IndexError, AttributeError, KeyError, TypeError):
            fn = self._resolve(args)
        return fn(*args, **kwargs)

    def _resolve(self, args: tuple[Any, ...]) -> Callable[..., Any]:
        """The kernel for these arguments' dtype (the first array's, or None), from the
        table the first time, then from the cache __call__ reads: a call whose first
        argument is an array finds it there at once; the rest (a state tuple, a dtype asked
        about) come here each time and find it by the dtype searched."""
        dtype = _dtype_of(args)
        fn = self._cache.get(dtype)
        if fn is None:
            name = ANY if dtype is None else str(getattr(dtype, "name", dtype))
            fn = getattr(self._set.family(lookup(self._op, self._set.kind, name)), self._op)
            self._cache[dtype] = fn
        return fn


class KernelSet:
    """A device's kernel set under one run policy: its state, and one attribute per op that
    calls the table's kernel for the call's dtype (`kernels.layernorm_forward(x, w, b, eps)`).
    """

    kind = "reference"
    # what its families may take (Family.uses): the policy's values read by _read_policy
    offers: tuple[str, ...] = ("policy", "attention", "head_chunk")

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.xp = backend.xp
        self._dispatchers()
        self._read_policy(backend.policy)

    def _dispatchers(self) -> None:
        """Fresh family instances and one dispatcher per op, all pointing at this set."""
        self._families: dict[type[Family], Family] = {}
        for op in ops():
            setattr(self, op, _Dispatch(self, op))

    def bound(self, backend: Any) -> KernelSet:
        """This kernel set for `backend`, a view of the same device under another run policy:
        the device's handles, caches and buffers are shared, and what the policy decides is
        read once, here."""
        view = copy.copy(self)
        view.backend = backend
        view._dispatchers()
        view._read_policy(backend.policy)
        return view

    def _read_policy(self, policy: RunPolicy) -> None:
        """Read what this set's kernels need from the run's policy (at creation only).
        ATTENTION: "materialized" makes attention_path say so; the others choose among the
        fused kernels (attention/cuda.py). LM_HEAD_CHUNK: the LM head's rows a chunk."""
        self.policy = policy
        self.attention = policy.attention
        self.head_chunk = policy.head_chunk

    def family(self, cls: type[Family]) -> Family:
        """This set's instance of an op family's class (made on first use, when what the
        class declares it takes is checked against what this set offers)."""
        found = self._families.get(cls)
        if found is None:
            missing = unmet(cls, self.offers)
            if missing:
                raise TypeError(f"{cls.__name__} takes {', '.join(missing)} from the "
                                f"{self.kind} kernel set, which offers none of them")
            found = self._families[cls] = cls(self)
        return found
