"""Device-aware Tensor and reverse-mode autograd: the engine's core, below the op library.

A Tensor wraps one raw array (numpy.ndarray or cupy.ndarray) on one device. An op is a
`Function` subclass: `forward` maps raw arrays to a raw array and `backward` maps the output
gradient to input gradients, again raw arrays, so no graph is built during backward.

Every forward and backward goes through `run_op`, the single choke point a profiler attaches
to. The profiler and the grad mode are the caller's context (context variables: set by a
`with` block, for its thread, and undone when it ends), never process-wide globals; without a
profiler the cost at the choke point is one context-variable read.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from .backend import Backend, DeviceError, device_name
from .library import get_backend
from .precision import accumulate_dtype

# The run's state at the choke point, scoped to the `with` block that set it (see no_grad,
# attach_profiler): whether ops record the graph, and the profiler (profiler.Profiler) or None.
_grad_enabled: contextvars.ContextVar[bool] = contextvars.ContextVar("grad_enabled",
                                                                     default=True)
_profiler: contextvars.ContextVar[Any] = contextvars.ContextVar("profiler", default=None)


def attach_profiler(profiler: Any) -> contextvars.Token[Any]:
    """Attach `profiler` to the choke point in the caller's context; `detach_profiler(token)`
    restores what was attached before (a profiler's `with` block does both)."""
    return _profiler.set(profiler)


def detach_profiler(token: contextvars.Token[Any]) -> None:
    _profiler.reset(token)


def run_op(name: str, category: str, phase: str, fn: Callable[..., Any], *args: Any,
           saved: Any = None) -> Any:
    """Run one op's forward/backward (or an optimizer kernel): the profiler's hook point.
    `saved`: the object whose arrays `fn` reads besides its arguments (a Function's saved
    activations, a row gradient's rows), which the profiler counts in the op's bytes."""
    prof = _profiler.get()
    if prof is None:
        return fn(*args)
    return prof.record(name, category, phase, fn, args, saved)


def count_gemm(a: Any, product: Any) -> Any:
    """Tell the profiler (if one is attached) of a GEMM A @ B -> product, inside the op that
    is timing it, so the op's FLOPs are known; returns the product."""
    prof = _profiler.get()
    if prof is not None:
        prof.add_gemm(a, product)
    return product


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Evaluate without recording the graph (no saved activations)."""
    token = _grad_enabled.set(False)
    try:
        yield
    finally:
        _grad_enabled.reset(token)


def grad_enabled() -> bool:
    return _grad_enabled.get()


class RowGrad:
    """The gradient of a row gather weight[idx]: zero except the gathered rows, where the
    (..., E) `rows` add up (indices may repeat). A leaf's .grad takes it by a scatter-add, so
    an embedding table never gets a dense (V, E) temporary (plus a full pass to add it)."""

    __slots__ = ("idx", "rows", "shape", "kernels")

    def __init__(self, idx: Any, rows: Any, shape: tuple[int, ...], kernels: Any) -> None:
        self.idx, self.rows, self.shape, self.kernels = idx, rows, shape, kernels

    def add_to(self, dst: Any) -> None:
        self.kernels.scatter_add_rows(dst, self.idx, self.rows)

    def dense(self) -> Any:
        out = self.kernels.xp.zeros(self.shape, dtype=self.rows.dtype)
        self.add_to(out)
        return out


def _add_into(dst: Any, g: Any) -> None:
    dst += g


class Function:
    """One op. Subclasses set `name`/`category` and implement forward/backward on raw arrays.

    `forward` may stash what backward needs on `self`; `release()` drops it as soon as
    backward has run, so activations are freed during the backward sweep.

    The keyword attributes `apply` takes are the subclass's class annotations (`eps: float`),
    optional where the class gives a default; any other keyword is an error, so a misspelt
    attribute cannot silently fall back to a default.
    """

    name: ClassVar[str] = "op"
    category: ClassVar[str] = "other"  # "matmul" or "other", for the profiler
    # Per input: the op that produced it, the input itself when it is a leaf, or None when no
    # gradient is wanted. Never a produced Tensor: its array stays alive only where an op saved
    # it for backward, so an activation nobody saved is freed as soon as the model drops it.
    parents: tuple[Function | Tensor | None, ...] = ()
    released: bool = False
    # Inputs whose gradient backward may join in its own pass: where another consumer of the
    # input has already given it a gradient, backward finds that in `pending` (by input; None
    # elsewhere) and returns its own gradient with it added, not beside it for an add.
    joins: ClassVar[tuple[int, ...]] = ()
    pending: tuple[Any, ...] = ()
    # What __init_subclass__ reads from a subclass's annotations: every attribute, and those
    # without a class default.
    attributes: ClassVar[frozenset[str]] = frozenset()
    required: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ops = [k for k in cls.__mro__ if issubclass(k, Function) and k is not Function]
        declared = {name for k in ops for name, hint in inspect.get_annotations(k).items()
                    if not str(hint).startswith(("ClassVar", "typing.ClassVar"))}
        cls.attributes = frozenset(declared)
        cls.required = frozenset(n for n in declared if not any(n in k.__dict__ for k in ops))

    def __init__(self, backend: Backend, **attrs: Any) -> None:
        self._check_attributes(attrs)
        self.backend = backend
        self.xp = backend.xp
        self.kernels = backend.kernels
        self.needs_input_grad: tuple[bool, ...] = ()
        self.__dict__.update(attrs)

    @classmethod
    def _check_attributes(cls, attrs: dict[str, Any]) -> None:
        keys = attrs.keys()
        if cls.required <= keys <= cls.attributes:  # every op call: the check alone
            return
        unknown = sorted(set(attrs) - cls.attributes)
        missing = sorted(cls.required - set(attrs))
        if unknown or missing:
            takes = ", ".join(sorted(cls.attributes)) or "none"
            problem = (f"unknown attribute(s) {', '.join(unknown)}" if unknown
                       else f"missing attribute(s) {', '.join(missing)}")
            raise TypeError(f"{cls.__name__}.apply: {problem}; it takes: {takes} "
                            "(declare a new one as a class annotation on the op)")

    def forward(self, *arrays: Any) -> Any:
        raise NotImplementedError

    def backward(self, grad: Any) -> Sequence[Any]:
        raise NotImplementedError

    def grad_buffers(self, *inputs: int) -> tuple[Any, ...]:
        """For each input index: where that input's gradient may be added directly, or None.

        An input that is a leaf whose .grad already exists in its accumulation dtype (a
        parameter: a view of the model's float32 gradient buffer) offers that buffer. The
        op's kernels then add the gradient into it inside their own last pass (a GEMM with
        beta = 1, a reduction's final sum) and the op returns None for that input, instead
        of a temporary that `_accumulate` adds afterwards in a pass of its own."""
        out = []
        for i in inputs:
            leaf = self.parents[i]
            grad = leaf.grad if isinstance(leaf, Tensor) else None
            usable = (grad is not None and grad.flags.c_contiguous
                      and grad.dtype == accumulate_dtype(leaf.data.dtype))
            out.append(grad if usable else None)
        return tuple(out)

    def release(self) -> None:
        keep = ("backend", "xp", "kernels")
        for key in [k for k in self.__dict__ if k not in keep]:
            del self.__dict__[key]
        self.released = True

    def matmul(self, a: Any, b: Any, phase: str, *, transpose_b: bool = False,
               out: Any = None, accumulate: bool = False, gradient: str | None = None) -> Any:
        """a @ b by the backend's kernel (b's last two axes swapped with transpose_b; into
        `out` when given, added to it with `accumulate`; `gradient`, "a" or "b", names the
        operand that is a gradient): every op's matrix product goes through here. Inside a
        fused op it is timed as its own 'matmul' entry; a matmul op (category 'matmul') is
        timed as one already, so its product is not recorded twice."""
        mm = self.kernels.matmul
        if self.category == "matmul":
            return count_gemm(a, mm(a, b, transpose_b=transpose_b, out=out,
                                    accumulate=accumulate, gradient=gradient))
        return self.gemm(phase)(mm, a, b, transpose_b=transpose_b, out=out,
                                accumulate=accumulate, gradient=gradient)

    def gemm(self, phase: str) -> Callable[..., Any]:
        """A runner `run(fn, *args, **kwargs)` for a backend GEMM inside this op (a plain one,
        or one with a fused epilogue): it is timed as this op's 'matmul' entry, so the profile
        separates the products from the op's own elementwise work."""
        name = f"{self.name}.matmul"

        def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return run_op(name, "matmul", phase,
                          lambda *a: count_gemm(a[0], fn(*a, **kwargs)), *args)

        return run

    @classmethod
    def apply(cls, *inputs: Tensor, **attrs: Any) -> Tensor:
        backend = _common_backend(cls.name, inputs)
        fn = cls(backend, **attrs)
        out = run_op(cls.name, cls.category, "forward", fn.forward, *(t.data for t in inputs))
        needs = tuple(t.requires_grad for t in inputs)
        if _grad_enabled.get() and any(needs):
            fn.parents = tuple((t._ctx or t) if need else None
                               for t, need in zip(inputs, needs, strict=True))
            fn.needs_input_grad = needs
            return Tensor.wrap(out, backend, requires_grad=True, ctx=fn)
        fn.release()
        return Tensor.wrap(out, backend)


def _common_backend(op: str, inputs: Sequence[Tensor]) -> Backend:
    backend = inputs[0].backend
    for t in inputs[1:]:
        if t.backend is not backend:
            raise DeviceError(_mixed(op, backend, t.backend))
    return backend


def _mixed(op: str, first: Backend, other: Backend) -> str:
    """Why two inputs cannot meet: two devices, or one device under two run policies."""
    if first.name == other.name:
        return (f"{op}: inputs belong to two runs on {first.name} (different run policies); "
                "make a run's tensors on its backend: Tensor(x, device=model.buffer.backend)")
    return (f"{op}: inputs live on different devices ({first.name} and {other.name}); "
            "move one explicitly with .to(device)")


class Tensor:
    """An n-d array on one device, with an optional gradient."""

    __slots__ = ("data", "grad", "requires_grad", "_ctx", "backend", "name")

    def __init__(
        self,
        data: Any,
        requires_grad: bool = False,
        device: str | Backend | None = None,
        name: str | None = None,
        _ctx: Function | None = None,
    ) -> None:
        if isinstance(data, Tensor):
            raise TypeError("Tensor(Tensor) is ambiguous: use .to(device) or .detach()")
        if device is None:  # where the array already is: the host, or its GPU
            on_gpu = hasattr(data, "__cuda_array_interface__")
            backend = get_backend(device_name("gpu", data.device.id) if on_gpu else "cpu")
            if not on_gpu:
                data = _as_host_array(data)
        else:  # a device's name, or a run's backend (one bound to its policy)
            backend = device if isinstance(device, Backend) else get_backend(device)
            if hasattr(data, "__cuda_array_interface__"):
                if backend.kind == "cpu":
                    raise DeviceError("Tensor(cupy array, device='cpu'): use .to('cpu')")
            else:
                data = backend.from_host(_as_host_array(data))
        self.data = data
        self.grad: Any = None
        self.requires_grad = requires_grad
        self._ctx = _ctx
        self.backend = backend
        self.name = name

    @classmethod
    def wrap(cls, data: Any, backend: Backend, requires_grad: bool = False,
             ctx: Function | None = None) -> Tensor:
        """A Tensor over an array already on `backend` (an op's output): no device lookup."""
        t = cls.__new__(cls)
        t.data, t.grad, t.requires_grad, t._ctx, t.backend, t.name = (
            data, None, requires_grad, ctx, backend, None)
        return t

    # ---- device and host access -------------------------------------------------------
    @property
    def device(self) -> str:
        return self.backend.name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> Any:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    def to(self, device: str) -> Tensor:
        """A copy on `device` (the only way across besides numpy()); counted as a transfer."""
        if device == self.device:
            return self
        target = get_backend(device)
        host = self.backend.to_host(self.data)
        return Tensor(target.from_host(host), requires_grad=self.requires_grad, name=self.name)

    def numpy(self) -> np.ndarray:
        return self.backend.to_host(self.data)

    def item(self) -> float:
        return float(self.numpy())

    def detach(self) -> Tensor:
        return Tensor(self.data)

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, device={self.device}{grad})"

    # ---- autograd -----------------------------------------------------------------------
    def backward(self, grad: Any = None,
                 on_leaf: Callable[[Tensor], None] | None = None) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's .grad; frees the graph as it goes.

        `on_leaf(t)` is called once a leaf's gradient is complete (every op that used it has
        run its backward), while the rest of backward goes on: data parallelism starts a
        gradient bucket's all-reduce there."""
        root = self._ctx
        if root is None:
            raise RuntimeError("backward() on a tensor that is not the result of a tracked op")
        if grad is None:
            if self.data.size != 1:
                raise RuntimeError("backward() without a gradient needs a scalar output")
            grad = run_op("loss_seed", "other", "backward", self.backend.xp.ones_like,
                          self.data)
        order = _topological_order(root)
        grads: dict[int, Any] = {id(root): grad}  # by the op whose output they are of
        self._ctx = None
        while order:
            node = order.pop()
            if isinstance(node, Tensor):  # a leaf: its gradient was added as it was produced
                if on_leaf is not None:
                    on_leaf(node)
                continue
            fn = node
            g = grads.pop(id(fn), None)
            if g is None:
                fn.release()
                continue
            if fn.released:
                raise RuntimeError(
                    f"backward() through '{fn.name}' a second time: its saved arrays were "
                    "freed by the first backward; run the forward again")
            if fn.joins:  # gradients that other consumers gave these inputs: fn adds them
                fn.pending = tuple(
                    grads.pop(id(p), None) if i in fn.joins and isinstance(p, Function)
                    else None for i, p in enumerate(fn.parents))
            in_grads = run_op(fn.name, fn.category, "backward", fn.backward, g, saved=fn)
            for parent, ig in zip(fn.parents, in_grads, strict=True):
                if parent is None or ig is None:
                    continue
                if isinstance(parent, Tensor):  # a leaf: add straight into .grad
                    parent._accumulate(ig)
                    continue
                if isinstance(ig, RowGrad):
                    ig = ig.dense()
                key = id(parent)
                grads[key] = ig if key not in grads else run_op(  # branches join
                    "grad_sum", "other", "backward", self.backend.kernels.add, grads[key], ig)
            fn.release()

    def _accumulate(self, g: Any) -> None:
        """Add a gradient into .grad; timed by the profiler as grad_accumulate (for a tied
        embedding, its scatter-add and the LM head's dense weight gradient land here)."""
        if self.grad is None:
            self.grad = g.dense() if isinstance(g, RowGrad) else g.copy()
        elif isinstance(g, RowGrad):
            run_op("grad_accumulate", "other", "backward", g.add_to, self.grad, saved=g)
        else:
            run_op("grad_accumulate", "other", "backward", _add_into, self.grad, g)


def _as_host_array(data: Any) -> np.ndarray:
    """NumPy arrays keep their dtype; Python numbers and lists default to float32/int64."""
    if isinstance(data, np.ndarray | np.generic):
        return np.asarray(data)
    array = np.asarray(data)
    return array.astype(np.float32) if array.dtype == np.float64 else array


def _topological_order(root: Function) -> list[Function | Tensor]:
    """The ops and leaves reachable from root, each after all of its parents (iterative DFS)."""
    order: list[Function | Tensor] = []
    seen: set[int] = set()
    stack: list[tuple[Function | Tensor, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if isinstance(node, Function):
            # leaves (parameters) last: popped first, so each finishes right after the op
            # that used it, and its gradient is complete early in backward (see on_leaf)
            parents = [p for p in node.parents if p is not None and id(p) not in seen]
            for parent in sorted(parents, key=lambda p: isinstance(p, Function)):
                stack.append((parent, False))
    return order
