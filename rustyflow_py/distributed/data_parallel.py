"""Data parallelism: one process per device, each on its own rows of every step's batch.

Every rank holds the whole model. After backward the gradients are summed over the ranks
(each rank's backward is seeded with 1 / (ranks x micro-steps), so the sum is the global
mean), in buckets of whole tensors from the parameter table: a bucket's all-reduce starts
on a second stream as soon as backward has finished its last tensor, and overlaps the rest
of backward. With SHARD_OPTIMIZER (ZeRO stage 1) the gradient is reduce-scattered instead,
each rank updates only its shard of the parameters with only its shard of the optimizer
state, and the updated shards are all-gathered: in mixed precision, the shards of the 16-bit
copy that the forward reads (half the bytes of the float32 master). Everything is a kernel
on a stream, so the whole step, collectives included, is still one CUDA graph.

GRAD_REDUCE_DTYPE=bf16 sums the gradient in bf16: each bucket is cast into a bf16 copy and
summed there by NCCL. Half the bytes cross the links; each rank's share is rounded to bf16
once and the sum once per hop, as with PyTorch DDP's bf16 compression hook and FSDP's
`reduce_dtype`. An optimizer that takes a bf16 gradient (AdamW and Adam on the GPU) reads the
summed copy (under ZeRO-1, its shard of it) itself; for the others it is widened back into
the float32 gradient. On NVLink the step is bound by each GPU's memory traffic more than by
the links, so the widening pass (6 bytes an element) is worth saving.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..engine.autograd import run_op
from ..engine.tensor import Tensor
from ..model.optim import Optimizer
from ..model.params import ParameterBuffer
from .comm import Communicator


class Wire:
    """The gradient as the collectives carry it: the gradient itself, or a copy of it in a
    narrower dtype that each sum goes through (cast, collective, widened back). A class of its
    own so that the all-reduce buckets and ZeRO-1's reduce-scatter share the casts and the
    stream rule, and so that the copy is allocated once for the run."""

    def __init__(self, buffer: ParameterBuffer, dtype: Any) -> None:
        grad = buffer.grad_storage
        self.backend = buffer.backend
        self.dtype = grad.dtype if dtype is None else np.dtype(dtype)
        self.copy = (None if self.dtype == grad.dtype
                     else buffer.backend.xp.empty(grad.size, self.dtype))
        self.widen = True  # False: the optimizer reads `copy`, summed, where it is

    def hand_to(self, optimizer: Optimizer, part: slice) -> None:
        """Let `optimizer` read `part` of the summed copy where the collective leaves it, when
        it can take a bf16 gradient: nothing is then widened back into the float32 one."""
        if self.copy is not None and optimizer.reads_bf16_grad:
            self.widen = False
            optimizer.summed_grad = self.copy[part]

    def view(self, start: int, stop: int) -> Any:
        """The copy's elements start..stop (those of the gradient storage's same slice), or
        None when the gradient travels as it is."""
        return None if self.copy is None else self.copy[start:stop]

    def sum(self, collective: Callable[..., None], grad: Any, wire: Any,
            keep: slice = slice(None), stream: Any = None) -> None:
        """`collective` over `grad` (a slice of the gradient storage) on `stream`, through
        `wire` (its `view`; None: in the gradient itself); what is widened back is `keep` of
        it (a reduce-scatter leaves only this rank's shard summed)."""
        if wire is None:
            collective(grad, stream)
            return
        if stream is not None:
            # the casts on the collective's stream: CuPy launches on the current one. By
            # use(), not `with stream:`, whose exit would leave the legacy default stream
            # current (engine/graph.py says why), and the rest of backward outside the graph
            stream.use()
        try:
            kernels = self.backend.kernels
            kernels.cast_into(wire, grad)
            collective(wire, stream)
            if self.widen:
                kernels.cast_into(grad[keep], wire[keep])
        finally:
            if stream is not None:
                self.backend.make_current()


class BucketedAllReduce:
    """Sums the gradient over the ranks, bucket by bucket, as backward completes them.

    `overlap`: the all-reduces run on a stream of their own, which the step's stream waits
    for at the end of backward; without it (an eager window's profiled steps) they run on the
    step's stream, where the profiler's events time them exactly. Bucket k is the op
    `all_reduce[k]` either way. `bucket_bytes` counts the bytes on the wire, in
    `reduce_dtype` (None: the gradient's own float32).
    """

    def __init__(self, buffer: ParameterBuffer, comm: Communicator, bucket_bytes: int,
                 reduce_dtype: Any = None) -> None:
        self.buffer, self.comm = buffer, comm
        self.wire = Wire(buffer, reduce_dtype)
        self.sum = functools.partial(self.wire.sum, comm.all_reduce)
        self.buckets = buffer.buckets(bucket_bytes, self.wire.dtype.itemsize)
        self.bucket_of: dict[int, int] = {}  # id(parameter tensor) -> its bucket
        self.counts = [0] * len(self.buckets)
        for span in buffer.spans:
            i = next(k for k, (a, b) in enumerate(self.buckets) if a <= span.offset < b)
            self.bucket_of[id(buffer.params[span.name])] = i
            self.counts[i] += 1
        self.backend = buffer.backend
        self.gpu = self.backend.kind == "gpu"
        if self.gpu:
            import cupy

            self.side = cupy.cuda.Stream(non_blocking=True)
            self.ready = [cupy.cuda.Event(disable_timing=True) for _ in self.buckets]
            self.done = cupy.cuda.Event(disable_timing=True)
        self.left: list[int] = []
        self.overlap = False

    def hand_to(self, optimizer: Optimizer) -> None:
        """Let `optimizer` read the summed bf16 copy where NCCL leaves it, when it can: the
        widening pass back into the float32 gradient is then left out. Every bucket is
        reduced every step (`finish`), so the copy is always whole and current."""
        self.wire.hand_to(optimizer, slice(0, self.buffer.grad.size))

    def start(self, overlap: bool) -> Callable[[Tensor], None]:
        """Arm for one backward; returns the hook backward calls as each leaf completes."""
        self.left, self.overlap = list(self.counts), overlap and self.gpu
        return self.leaf_ready

    def leaf_ready(self, tensor: Tensor) -> None:
        i = self.bucket_of.get(id(tensor))
        if i is None:
            return
        self.left[i] -= 1
        if self.left[i] == 0:
            self._reduce(i)

    def _reduce(self, i: int) -> None:
        self.left[i] = -1  # launched
        start, stop = self.buckets[i]
        grad, wire = self.buffer.grad[start:stop], self.wire.view(start, stop)
        name = f"all_reduce[{i}]"  # each bucket an op of its own, in every profile
        if not self.overlap:
            run_op(name, "comm", "backward", self.sum, grad, wire)
            return
        self.ready[i].record(self.backend.stream)  # the bucket's gradient is written
        self.side.wait_event(self.ready[i])
        # through the op choke point too: while the step is captured for the graph profile,
        # the NCCL nodes are tagged with the bucket's op, not with the backward op running
        run_op(name, "comm", "backward", self.sum, grad, wire, slice(None), self.side)

    def finish(self) -> None:
        """Reduce what backward never reached (unused tensors), then join the side stream."""
        for i, left in enumerate(self.left):
            if left >= 0:
                self._reduce(i)
        if self.overlap:
            self.done.record(self.side)
            self.backend.stream.wait_event(self.done)


class ReduceScatter:
    """ZeRO-1's gradient sync: one reduce-scatter of the whole (padded) gradient after
    backward, leaving each rank the global sum of its own shard."""

    def __init__(self, buffer: ParameterBuffer, comm: Communicator,
                 reduce_dtype: Any = None) -> None:
        self.buffer, self.comm = buffer, comm
        self.wire = Wire(buffer, reduce_dtype)
        self.sum = functools.partial(self.wire.sum, comm.reduce_scatter)

    def hand_to(self, optimizer: ShardedOptimizer) -> None:
        """Let the sharded optimizer read this rank's shard of the summed bf16 copy where the
        reduce-scatter leaves it, when it can (as BucketedAllReduce.hand_to): nothing is
        widened back."""
        self.wire.hand_to(optimizer.inner, self.comm.shard(self.buffer.grad_storage))

    def start(self, overlap: bool) -> None:
        return None

    def finish(self) -> None:
        grad = self.buffer.grad_storage
        run_op("reduce_scatter", "comm", "backward", self.sum, grad,
               self.wire.view(0, grad.size), self.comm.shard(grad))


@dataclasses.dataclass
class Shard:
    """The slice of a parameter buffer one rank's sharded optimizer sees: the interface an
    elementwise optimizer reads (flat, grad, decay_size, backend, compute_flat). With a
    `compute_flat` (the same slice of the 16-bit copy) the update writes it, as over a whole
    buffer; without one the whole copy is refreshed after the all-gather."""

    flat: Any
    grad: Any
    decay_size: int
    backend: Any
    compute_flat: Any = None

    def sync_compute(self) -> None:
        """Cast the shard's master into its slice of the compute copy, if it has one."""
        if self.compute_flat is not None:
            self.backend.kernels.cast_into(self.compute_flat, self.flat)


class ShardedOptimizer:
    """ZeRO-1 around an elementwise optimizer built on this rank's Shard: it updates only the
    shard, then the ranks all-gather what the next forward reads. Checkpoints hold the full
    state (gathered from every rank), so a sharded run resumes on any number of processes.

    With a 16-bit compute copy and `gather_compute`, only that copy is gathered: each rank's
    update writes its shard of it (AdamW's and Adam's kernel in the same pass), so the
    all-gather carries half the bytes of the float32 master and no cast of the whole buffer
    follows it. The master is then current only in this rank's own shard, until
    `gather_master` (a collective) makes it whole for whatever reads it between steps:
    validation's best checkpoint, the checkpoint, the test. A run with weight averaging
    (EMA_DECAY's update reads the whole master every step) gathers the master instead.
    """

    def __init__(self, buffer: ParameterBuffer, comm: Communicator,
                 make: Callable[[Any], Optimizer], gather_compute: bool = True) -> None:
        self.buffer, self.comm, self.size = buffer, comm, buffer.flat.size
        mine = comm.shard(buffer.storage)
        self.lo = mine.start
        n = mine.stop - mine.start
        self.gathers_compute = gather_compute and buffer.compute_storage is not buffer.storage
        shard = Shard(buffer.storage[mine], buffer.grad_storage[mine],
                      max(0, min(buffer.decay_size - self.lo, n)), buffer.backend,
                      buffer.compute_storage[mine] if self.gathers_compute else None)
        self.inner = make(shard)
        self.inner.sum_over_shards = comm.all_reduce

    def __getattr__(self, name: str) -> Any:
        # step_count, lr, grad_norm, schedule, state_names...: the inner optimizer's
        return getattr(self.__dict__["inner"], name)

    @property
    def loss_scaler(self) -> Any:
        return self.inner.loss_scaler

    @loss_scaler.setter
    def loss_scaler(self, scaler: Any) -> None:
        self.inner.loss_scaler = scaler

    def step(self) -> None:
        self.inner.step()
        if self.gathers_compute:
            run_op("all_gather", "comm", "optimizer", self.comm.all_gather,
                   self.buffer.compute_storage)
            return
        run_op("all_gather", "comm", "optimizer", self.comm.all_gather, self.buffer.storage)
        self.buffer.sync_compute()

    def gather_master(self) -> None:
        """Every rank's shard of the float32 master, gathered into the whole buffer on every
        rank (a collective: all ranks call it), where the steps gathered only the compute
        copy; nothing otherwise."""
        if self.gathers_compute:
            run_op("all_gather_master", "comm", "optimizer", self.comm.all_gather,
                   self.buffer.storage)

    def state_sizes(self) -> dict[str, int]:
        sizes = self.inner.state_sizes()
        return {k: (v if k == "step_count" else self.size) for k, v in sizes.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        """The full state: every rank's shard, gathered (a collective: all ranks call it)."""
        backend, xp = self.buffer.backend, self.buffer.backend.xp
        state = {}
        for name in self.inner.state_names:
            part = getattr(self.inner, name)
            full = xp.zeros(self.buffer.storage.size, part.dtype)
            full[self.lo : self.lo + part.size] = part
            self.comm.all_gather(full)
            state[name] = backend.to_host(full[: self.size])
        state["step_count"] = backend.to_host(self.inner.step_count)
        if self.inner.loss_scaler is not None:
            state.update(self.inner.loss_scaler.state_dict(backend.to_host))
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        backend = self.buffer.backend
        for name in self.inner.state_names:
            if name not in state:
                raise ValueError(f"optimizer state lacks {name!r}: saved by another optimizer?")
            part = getattr(self.inner, name)
            full = np.zeros(self.buffer.storage.size, part.dtype)
            full[: self.size] = np.asarray(state[name])
            part[...] = backend.from_host(full[self.lo : self.lo + part.size])
        self.inner.step_count[...] = backend.from_host(np.asarray(state["step_count"]))
        if self.inner.loss_scaler is not None:
            self.inner.loss_scaler.load_state_dict(state, backend.from_host)
