"""Collectives between the processes of a data-parallel run, one process per device.

GPUs talk through NCCL (CuPy's binding): its collectives are kernels on a stream, so they
order with the step's other kernels, overlap with them on a second stream, and are captured
into the step's CUDA graph like any kernel. The NCCL unique id travels over the rendezvous.

The CPU has a transport too, over the rendezvous's data sockets (rank 0 sums, then sends the
result back): it is slow and exists so the data-parallel logic runs, and is tested, on any
machine. Every collective is in place and sums; callers scale before (a gradient average is
a sum of gradients already divided by the number of contributions).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backend import Backend
from .rendezvous import Rendezvous


class Communicator:
    """In-place sum collectives over `size` processes; `stream` is a GPU stream to run on
    (default: the backend's), ignored on the CPU."""

    def __init__(self, backend: Backend, rendezvous: Rendezvous, rank: int, size: int) -> None:
        self.backend, self.rendezvous, self.rank, self.size = backend, rendezvous, rank, size

    def all_reduce(self, x: Any, stream: Any = None) -> None:
        """x <- the sum of every rank's x."""
        raise NotImplementedError

    def reduce_scatter(self, x: Any, stream: Any = None) -> None:
        """x is `size` equal shards: this rank's shard <- the sum of that shard over ranks
        (the other shards are left as scratch)."""
        raise NotImplementedError

    def all_gather(self, x: Any, stream: Any = None) -> None:
        """x is `size` equal shards: every shard <- what its owner rank holds there."""
        raise NotImplementedError

    def shard(self, x: Any) -> slice:
        """This rank's shard of a 1-D array of `size` equal shards."""
        n = x.size // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def abort(self) -> None:
        """Unblock whatever waits on a peer that is gone (best effort)."""

    def close(self, clean: bool) -> None:
        """Leave the group. `clean`: every process got here (a finished or agreed-stopped
        run), so wait for all of them first; otherwise just tear down this end."""
        if clean:
            self.backend.synchronize()
            self.rendezvous.barrier()
        self.abort()


class SocketCommunicator(Communicator):
    """The CPU transport: each collective is a gather at rank 0 and a broadcast back."""

    def all_reduce(self, x: Any, stream: Any = None) -> None:
        x[...] = self._summed(x)

    def reduce_scatter(self, x: Any, stream: Any = None) -> None:
        mine = self.shard(x)
        x[mine] = self._summed(x)[mine]

    def all_gather(self, x: Any, stream: Any = None) -> None:
        parts = self.rendezvous.all_gather(np.ascontiguousarray(x[self.shard(x)]).tobytes())
        x[...] = np.frombuffer(b"".join(parts), dtype=x.dtype)

    def _summed(self, x: Any) -> np.ndarray:
        """The sum over ranks, added in rank order (every rank gets the same bits)."""
        parts = self.rendezvous.gather(np.ascontiguousarray(x).tobytes())
        total = None
        if parts is not None:
            arrays = [np.frombuffer(p, dtype=x.dtype).reshape(x.shape) for p in parts]
            total = arrays[0].copy()
            for a in arrays[1:]:
                total += a
        data = self.rendezvous.broadcast(None if total is None else total.tobytes())
        return np.frombuffer(data, dtype=x.dtype).reshape(x.shape)


class NcclCommunicator(Communicator):
    """NCCL on this process's GPU; every call is an asynchronous kernel on `stream`."""

    def __init__(self, backend: Backend, rendezvous: Rendezvous, rank: int, size: int) -> None:
        super().__init__(backend, rendezvous, rank, size)
        from cupy.cuda import nccl

        self.nccl = nccl
        uid = rendezvous.broadcast(_pack_id(nccl.get_unique_id()) if rank == 0 else None)
        try:
            self.comm = nccl.NcclCommunicator(size, uid, rank)  # CuPy 13+: the id as bytes
        except TypeError:  # older CuPy: a tuple of its chars
            self.comm = nccl.NcclCommunicator(size, tuple(uid), rank)
        self.types = {np.dtype(np.float32): nccl.NCCL_FLOAT32,
                      np.dtype(np.float64): nccl.NCCL_FLOAT64,
                      np.dtype(np.float16): nccl.NCCL_FLOAT16,
                      np.dtype(np.int32): nccl.NCCL_INT32}

    def _stream(self, stream: Any) -> int:
        return (stream or self.backend.stream).ptr

    def all_reduce(self, x: Any, stream: Any = None) -> None:
        self.comm.allReduce(x.data.ptr, x.data.ptr, x.size, self.types[x.dtype],
                            self.nccl.NCCL_SUM, self._stream(stream))

    def reduce_scatter(self, x: Any, stream: Any = None) -> None:
        n = x.size // self.size  # in place: the output is this rank's shard of the input
        self.comm.reduceScatter(x.data.ptr, x.data.ptr + self.rank * n * x.itemsize, n,
                                self.types[x.dtype], self.nccl.NCCL_SUM, self._stream(stream))

    def all_gather(self, x: Any, stream: Any = None) -> None:
        n = x.size // self.size
        self.comm.allGather(x.data.ptr + self.rank * n * x.itemsize, x.data.ptr, n,
                            self.types[x.dtype], self._stream(stream))

    def abort(self) -> None:
        """ncclCommAbort: local and never waits for a peer (a communicator left to be
        destroyed at exit can wait forever for one that has already gone)."""
        try:
            self.comm.abort()
        except Exception:  # already torn down, or the library predates abort: nothing to do
            pass


def _pack_id(uid: bytes | tuple[int, ...]) -> bytes:
    return uid if isinstance(uid, bytes) else bytes(v & 0xFF for v in uid)


def communicator(backend: Backend, rendezvous: Rendezvous, rank: int,
                 size: int) -> Communicator:
    """NCCL on a GPU, the socket transport on the CPU."""
    cls = NcclCommunicator if backend.kind == "gpu" else SocketCommunicator
    return cls(backend, rendezvous, rank, size)
