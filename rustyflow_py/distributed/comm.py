"""Collectives between the processes of a data-parallel run, one process per device.

On the CPU they are MPI's (mpi4py on the NumPy buffer itself, in place): the library picks a
ring, recursive halving or whatever suits the sizes and the network. GPUs talk through NCCL
(CuPy's binding): its collectives are kernels on a stream, so they order with the step's
other kernels, overlap with them on a second stream, and are captured into the step's CUDA
graph like any kernel; MPI only carries NCCL's unique id from rank 0 to the others. Every
collective is in place and sums; callers scale before (a gradient average is a sum of
gradients already divided by the number of contributions).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..engine.backend import Backend
from ..engine.precision import bfloat16


class Communicator:
    """In-place sum collectives over the processes of `mpi_comm`; `stream` is a GPU stream
    to run on (default: the backend's), ignored on the CPU."""

    def __init__(self, backend: Backend, mpi_comm: Any) -> None:
        self.backend, self.mpi_comm = backend, mpi_comm
        self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()

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

    def barrier(self) -> None:
        """Return once every rank's queued work is done and every rank got here."""
        self.backend.synchronize()
        self.mpi_comm.Barrier()

    def abort(self) -> None:
        """Unblock whatever waits on a peer that is gone (best effort)."""

    def close(self, clean: bool) -> None:
        """Leave the group. `clean`: every process got here (a finished or agreed-stopped
        run), so wait for all of them first; otherwise just tear down this end."""
        if clean:
            self.barrier()
        self.abort()


class MpiCommunicator(Communicator):
    """The CPU transport: MPI's collectives straight on the NumPy buffers."""

    def __init__(self, backend: Backend, mpi_comm: Any) -> None:
        super().__init__(backend, mpi_comm)
        from mpi4py import MPI

        self.in_place = MPI.IN_PLACE

    def all_reduce(self, x: Any, stream: Any = None) -> None:
        self.mpi_comm.Allreduce(self.in_place, _flat(x))

    def reduce_scatter(self, x: Any, stream: Any = None) -> None:
        # In place, MPI leaves this rank's summed shard at the front of the buffer.
        self.mpi_comm.Reduce_scatter_block(self.in_place, x)
        mine = self.shard(x)
        if mine.start:
            x[mine] = x[: mine.stop - mine.start]

    def all_gather(self, x: Any, stream: Any = None) -> None:
        self.mpi_comm.Allgather(self.in_place, x)


def _flat(x: np.ndarray) -> np.ndarray:
    """A 0-d array as the 1-element buffer MPI takes (the same memory)."""
    return x.reshape(1) if x.ndim == 0 else x


class NcclCommunicator(Communicator):
    """NCCL on this process's GPU; every call is an asynchronous kernel on `stream`."""

    def __init__(self, backend: Backend, mpi_comm: Any) -> None:
        super().__init__(backend, mpi_comm)
        from cupy.cuda import nccl

        self.nccl = nccl
        uid = mpi_comm.bcast(_pack_id(nccl.get_unique_id()) if self.rank == 0 else None, root=0)
        try:
            self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)  # CuPy 13+: bytes
        except TypeError:  # older CuPy: a tuple of its chars
            self.comm = nccl.NcclCommunicator(self.size, tuple(uid), self.rank)
        self.types = {np.dtype(np.float32): nccl.NCCL_FLOAT32,
                      np.dtype(np.float64): nccl.NCCL_FLOAT64,
                      np.dtype(np.float16): nccl.NCCL_FLOAT16,
                      np.dtype(np.int32): nccl.NCCL_INT32}
        try:  # ncclBfloat16 is 9 in nccl.h (NCCL 2.10+); older CuPy does not name it
            self.types[bfloat16()] = getattr(nccl, "NCCL_BFLOAT16", 9)
        except ImportError:  # no ml_dtypes: no bf16 array can reach here either
            pass

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


def communicator(backend: Backend, mpi_comm: Any) -> Communicator:
    """NCCL on a GPU, MPI on the CPU."""
    cls = NcclCommunicator if backend.kind == "gpu" else MpiCommunicator
    return cls(backend, mpi_comm)
