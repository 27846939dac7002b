"""ZeRO-1 in mixed precision, as units: the ranks all-gather the 16-bit compute copy, each
rank's update writes its own shard of it, and the float32 master is made whole only when
something between steps reads it (`gather_master`).

The ranks are threads of this process with a communicator that meets at a barrier (the MPI
and NCCL ones are tested in test_data_parallel.py and, on GPUs, test_multi_gpu.py), so a
bf16 compute copy runs on the CPU, which the CLI refuses for whole runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rustyflow_py.distributed.data_parallel import ReduceScatter, ShardedOptimizer
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.model.optim import SGD, AdamW, Optimizer, Schedule
from rustyflow_py.model.params import ParameterBuffer

RANKS, STEPS = 2, 3


class Meeting:
    """What the ranks' communicators share: a barrier and a slot per rank."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(RANKS, timeout=30)
        self.slots: list[Any] = [None] * RANKS
        self.gathered: list[tuple[int, str, int]] = []  # (rank, dtype, size) of all-gathers


class ThreadComm:
    """One rank's in-place sum collectives over the other threads' arrays."""

    size = RANKS

    def __init__(self, rank: int, meeting: Meeting) -> None:
        self.rank, self.meeting = rank, meeting

    def shard(self, x: Any) -> slice:
        n = x.size // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def _sum(self, x: Any) -> Any:
        """The sum of every rank's x (float64, then x's dtype), once all have arrived."""
        m = self.meeting
        m.slots[self.rank] = x
        m.barrier.wait()
        total = sum(np.asarray(s, np.float64) for s in m.slots).astype(x.dtype)
        m.barrier.wait()  # every rank has read every slot before any writes its own
        return total

    def all_reduce(self, x: Any, stream: Any = None) -> None:
        x[...] = self._sum(x)

    def reduce_scatter(self, x: Any, stream: Any = None) -> None:
        mine = self.shard(x)
        x[mine] = self._sum(x)[mine]

    def all_gather(self, x: Any, stream: Any = None) -> None:
        m = self.meeting
        m.gathered.append((self.rank, x.dtype.name, x.size))
        m.slots[self.rank] = x
        m.barrier.wait()
        n = x.size // self.size
        for r in range(self.size):
            if r != self.rank:
                x[r * n : (r + 1) * n] = m.slots[r][r * n : (r + 1) * n]
        m.barrier.wait()


def model(bf16: Any, pad_to: int) -> GPT:
    return GPT(GPTConfig(vocab_size=50, seq_len=8, n_layer=1, n_head=2, n_embd=16), "cpu",
               seed=3, pad_to=pad_to, compute=bf16)


def gradient(rank: int, step: int, buffer: ParameterBuffer) -> np.ndarray:
    """Rank `rank`'s gradient at `step`: random, different on every rank and step."""
    rng = np.random.default_rng(100 * step + rank)
    return rng.standard_normal(buffer.flat.size).astype(np.float32) * 1e-2


def adamw(buffer: Any) -> Optimizer:
    # no clip: the sharded norm's float rounding would differ from the whole one's
    return AdamW(buffer, Schedule(1e-2, 0, STEPS, 0.1), grad_clip=0.0)


def sgd(buffer: Any) -> Optimizer:
    return SGD(buffer, Schedule(1e-2, 0, STEPS, 0.1), momentum=0.9, grad_clip=0.0)


def run_ranks(bf16: Any, make: Callable[[Any], Optimizer], gather_compute: bool = True,
              ) -> tuple[list[GPT], list[ShardedOptimizer], Meeting, list[np.ndarray]]:
    """STEPS sharded steps on RANKS threads; each rank's model, optimizer, the meeting, and
    each rank's float32 master as it stood after the last step, before any gather_master."""
    meeting = Meeting()
    models = [model(bf16, RANKS) for _ in range(RANKS)]
    opts: list[Any] = [None] * RANKS
    masters: list[Any] = [None] * RANKS
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            buffer, comm = models[r].buffer, ThreadComm(r, meeting)
            opts[r] = ShardedOptimizer(buffer, comm, make, gather_compute)
            sync = ReduceScatter(buffer, comm)
            for step in range(STEPS):
                buffer.grad[...] = gradient(r, step, buffer)
                sync.finish()
                opts[r].step()
            masters[r] = buffer.flat.copy()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
            meeting.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return models, opts, meeting, masters


def one_process(bf16: Any, make: Callable[[Any], Optimizer]) -> ParameterBuffer:
    """The same steps on one process, over the summed gradients."""
    buffer = model(bf16, 1).buffer
    opt = make(buffer)
    for step in range(STEPS):
        buffer.grad[...] = sum(gradient(r, step, buffer) for r in range(RANKS))
        opt.step()
    return buffer


@pytest.fixture(scope="module")
def bf16() -> Any:
    return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)


@pytest.mark.parametrize("make", [adamw, sgd], ids=["adamw", "sgd"])
def test_the_ranks_gather_the_compute_copy_and_it_equals_one_process(
        bf16: Any, make: Callable[[Any], Optimizer]) -> None:
    """AdamW writes its shard of the copy in its update, SGD through the shard's cast: on
    every rank the gathered copy is the one-process copy, bit for bit."""
    models, opts, meeting, _ = run_ranks(bf16, make)
    want = one_process(bf16, make)
    padded = models[0].buffer.compute_storage.size
    assert padded % RANKS == 0 and padded >= want.flat.size
    for m, opt in zip(models, opts, strict=True):
        assert opt.gathers_compute
        np.testing.assert_array_equal(m.buffer.compute_flat, want.compute_flat)
    # every step's all-gather carried the 16-bit copy (half the master's bytes), never the
    # master itself
    assert sorted(meeting.gathered) == sorted([(r, "bfloat16", padded)
                                               for r in range(RANKS)] * STEPS)


def test_the_master_is_whole_only_after_gather_master(bf16: Any) -> None:
    models, opts, meeting, masters = run_ranks(bf16, adamw)
    want = one_process(bf16, adamw).flat
    start = model(bf16, RANKS).buffer.flat
    for r, (m, opt) in enumerate(zip(models, opts, strict=True)):
        mine = opt.comm.shard(m.buffer.storage)
        mine = slice(mine.start, min(mine.stop, want.size))
        np.testing.assert_array_equal(masters[r][mine], want[mine])  # its own shard: current
        other = np.ones(want.size, bool)
        other[mine] = False
        np.testing.assert_array_equal(masters[r][other], start[other])  # the rest: as it began
    meeting.gathered.clear()
    threads = [threading.Thread(target=opt.gather_master) for opt in opts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(meeting.gathered) == [(r, "float32", models[0].buffer.storage.size)
                                        for r in range(RANKS)]
    for m in models:
        np.testing.assert_array_equal(m.buffer.flat, want)


def test_with_weight_averaging_the_master_is_gathered_every_step(bf16: Any) -> None:
    """gather_compute=False (a run with EMA_DECAY): the steps gather the float32 master and
    cast the whole copy, so the master is whole after every step, and gather_master has
    nothing to do."""
    models, opts, meeting, masters = run_ranks(bf16, adamw, gather_compute=False)
    want = one_process(bf16, adamw)
    assert {d for _, d, _ in meeting.gathered} == {"float32"}
    for m, opt, master in zip(models, opts, masters, strict=True):
        assert not opt.gathers_compute
        np.testing.assert_array_equal(master, want.flat)
        np.testing.assert_array_equal(m.buffer.compute_flat, want.compute_flat)
        meeting.gathered.clear()
        opt.gather_master()
        assert meeting.gathered == []


def test_a_float32_run_has_no_copy_to_gather() -> None:
    buffer = model(None, RANKS).buffer
    assert buffer.compute_storage is buffer.storage and buffer.compute_flat is buffer.flat
    opt = ShardedOptimizer(buffer, ThreadComm(0, Meeting()), adamw)
    assert not opt.gathers_compute and opt.inner.buffer.compute_flat is None
