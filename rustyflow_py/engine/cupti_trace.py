"""CUPTI, through NVIDIA's `cupti-python`: graph nodes tagged at capture, kernel records at replay.

Why CUPTI, and not timing events placed between the ops of a profiling copy of the graph:
events give one time per op and nothing below it, while the profile must list each op's
kernels (cuBLASLt's separate epilogue passes, say) and time the graph that training replays,
not a copy with extra nodes. CUPTI gives both: its resource callbacks fire for every node a
stream capture creates (and for the clones the instantiation makes), so each node id can be
tagged with the op running at that moment; its activity records of a replay carry the node id
of every kernel, memset and memcpy, with device timestamps. Recording is switched on only for
the sampled replays, so the other replays run untouched.

CUPTI allows one subscriber per process: with Nsight Systems (or another CUPTI tool) attached,
`CuptiUnavailable` says so and the trainer falls back to the eager window.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import install_command
from .kernel_records import KernelRecord, OpKey


def _install() -> str:
    """How to get cupti-python: the gpu extras bring it."""
    return (f"{install_command('gpu')} (or {install_command('cuda13')} for CUDA 13), which "
            "brings NVIDIA's cupti-python; or set PROFILE_MODE=eager")


class CuptiUnavailable(RuntimeError):
    """CUPTI cannot trace here (not installed, or another profiler holds it); says why."""


def demangle(name: str) -> str:
    """A C++ kernel name as people read it (cxxfilt, part of the gpu extra); CUPTI reports
    the mangled symbol (`_ZN7cutlass7Kernel2I...`), kept as is when cxxfilt is missing."""
    if not name.startswith("_Z"):
        return name
    try:
        import cxxfilt

        return str(cxxfilt.demangle(name))
    except Exception:  # not installed, or a symbol it cannot read: the raw name is still exact
        return name


def _load() -> Any:
    try:
        from cupti import cupti
    except Exception as exc:  # ImportError, or a CUPTI library that fails to load
        raise CuptiUnavailable(f"cupti-python is not usable ({type(exc).__name__}: {exc}); "
                               f"{_install()}") from exc
    return cupti


class CuptiTracer:
    """Tags graph nodes with ops during a capture (`tag_nodes`) and returns the kernel records
    of replays run under `records`. One per trainer (CUPTI itself stays loaded: unloading it
    mid-process is unsafe)."""

    _KINDS = ("CONCURRENT_KERNEL", "MEMSET", "MEMCPY")

    def __init__(self) -> None:
        self._cupti = _load()
        with self.tag_nodes(lambda: None):  # another CUPTI tool would refuse us: find out now
            pass
        self.node_ops: dict[int, OpKey] = {}
        self._records: list[KernelRecord] = []
        self._names: dict[str, str] = {}  # mangled -> readable kernel names
        self.read_s = 0.0  # the last `records` call's time from the device idle to the records
        self._registered = False

    # ---- capture: which op made each node ---------------------------------------------------
    @contextlib.contextmanager
    def tag_nodes(self, current: Callable[[], OpKey | None]) -> Iterator[None]:
        """While inside, every graph node created is tagged with `current()` (the op running
        then); the clones made when the graph is instantiated take their original's tag."""
        cupti = self._cupti
        created: dict[int, OpKey | None] = {}
        clones: list[tuple[int, int]] = []
        resource = cupti.CallbackDomain.RESOURCE
        ids = cupti.CallbackIdResource

        def callback(_user: Any, domain: int, cbid: int, data: Any) -> None:
            if domain != resource:
                return
            graph = cupti.GraphData.from_ptr(data.resource_descriptor)
            node = cupti.get_graph_node_id(graph.node)
            if cbid == ids.GRAPHNODE_CLONED:
                clones.append((node, cupti.get_graph_node_id(graph.original_node)))
            elif cbid == ids.GRAPHNODE_CREATED:
                created.setdefault(node, current())

        try:
            subscriber = cupti.subscribe(callback, None)
        except Exception as exc:
            raise CuptiUnavailable(f"CUPTI is in use by another tool (a profiler such as Nsight "
                                   f"Systems?): {exc}") from exc
        try:
            for cbid in (ids.GRAPHNODE_CREATED, ids.GRAPHNODE_CLONED):
                cupti.enable_callback(1, subscriber, resource, cbid)
            yield
        finally:
            cupti.unsubscribe(subscriber)
        for clone, original in clones:  # an instantiated graph's node: its original's op
            created[clone] = created.get(original)
        self.node_ops = {node: op for node, op in created.items() if op is not None}

    # ---- replay: the kernel records -----------------------------------------------------------
    def records(self, run: Callable[[], None], synchronize: Callable[[], None]
                ) -> list[KernelRecord]:
        """Run `run` (replays) with kernel, memset and memcpy recording on; its records.
        `read_s` is then the time from the device's finishing them to the records in hand:
        what recording adds to a run (the wait before it is for work queued anyway)."""
        cupti = self._cupti
        if not self._registered:
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            self._registered = True
        kinds = [getattr(cupti.ActivityKind, k) for k in self._KINDS]
        self._records = []
        try:
            for kind in kinds:
                cupti.activity_enable(kind)
        except Exception as exc:
            raise CuptiUnavailable(f"CUPTI refused kernel recording: {exc}") from exc
        try:
            run()
            synchronize()
        finally:
            after_sync = time.perf_counter()
            for kind in kinds:
                cupti.activity_disable(kind)
            cupti.activity_flush_all(1)
        records, self._records = self._records, []
        self.read_s = time.perf_counter() - after_sync
        return records

    @staticmethod
    def _buffer_requested() -> tuple[int, int]:
        return 8 * 1024 * 1024, 0  # bytes, and no limit on the records per buffer

    def _buffer_completed(self, activities: list[Any]) -> None:
        kernel = self._cupti.ActivityKind.CONCURRENT_KERNEL
        memset = self._cupti.ActivityKind.MEMSET
        for a in activities:
            if a.kind == kernel:
                name = self._names.get(a.name) or self._names.setdefault(a.name,
                                                                          demangle(a.name))
            else:
                name = "[memset]" if a.kind == memset else "[memcpy]"
            self._records.append(KernelRecord(name, int(a.start), int(a.end),
                                              int(a.graph_node_id), int(a.stream_id)))
