"""A model's parameters as views into one flat device buffer, laid out by a table of spans.

As in llm.c, the parameters are one allocation (their gradients another) and a table says
where each tensor lives in it. The optimizer, the grad-norm and zero_grad are then each one
pass over memory (one kernel on the GPU), a checkpoint is one transfer, and anything done per
tensor or per group of tensors reads its offsets from the table instead of recomputing them.
Decayed tensors (2-D and up) are packed first, so weight decay is a single boundary index.

Mixed precision adds a third allocation: a 16-bit copy of the parameters that the forward
reads, refreshed from the float32 master once per step (by AdamW's and Adam's own update
kernel, or a cast kernel after the other optimizers). The model's tensors
are views of that copy, but their gradients are views of the float32 gradient buffer, so every
contribution to a parameter's gradient is summed in float32 and the optimizer never sees a
16-bit value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..engine.backend import Backend
from ..engine.library import get_backend
from ..engine.tensor import Tensor
from .init import Init


@dataclasses.dataclass(frozen=True)
class Span:
    """Where one parameter tensor lives: elements offset..offset+size of the flat buffer."""

    name: str
    offset: int
    shape: tuple[int, ...]
    decayed: bool  # weight decay applies (2-D and up: matrices and embeddings)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class ParameterBuffer:
    """Named parameters as views into one flat array; gradients likewise.

    `spans` lists the tensors in buffer order; the `decay_size` elements at the front belong
    to the decayed ones. `storage` and `grad_storage` are the allocations behind `flat` and
    `grad`, padded with zeros to a multiple of `pad_to` elements: a sharded optimizer splits
    them into equal shards, one per process. With a `compute` dtype other than `dtype`, the
    tensors in `params` are views of `compute_flat`, that dtype's copy of `flat`
    (`sync_compute` refreshes it), itself the front of `compute_storage`, padded likewise.
    """

    def __init__(self, weights: Mapping[str, np.ndarray | Init], device: str | Backend,
                 dtype: Any, pad_to: int = 1, compute: Any = None) -> None:
        backend = device if isinstance(device, Backend) else get_backend(device)
        names = sorted(weights, key=lambda n: weights[n].ndim < 2)  # stable: decayed first
        spans, offset = [], 0
        for n in names:
            spans.append(Span(n, offset, tuple(weights[n].shape), weights[n].ndim >= 2))
            offset += weights[n].size
        self.spans: tuple[Span, ...] = tuple(spans)
        self.decay_size = sum(s.size for s in self.spans if s.decayed)
        # Allocated on the device and filled one tensor at a time: an `Init` is made there
        # (model/init.py), a host array is copied over; the host never holds a flat copy.
        self.storage = backend.xp.zeros(-(-offset // pad_to) * pad_to, dtype=dtype)
        for s in self.spans:
            w, view = weights[s.name], self.storage[s.offset : s.offset + s.size]
            if isinstance(w, Init):
                w.fill_into(backend.xp, view)
            else:
                view[...] = backend.from_host(np.ascontiguousarray(w.ravel(), dtype=dtype))
        self.grad_storage = backend.xp.zeros_like(self.storage)
        self.flat, self.grad = self.storage[:offset], self.grad_storage[:offset]
        compute = np.dtype(dtype if compute is None else compute)
        self.compute_storage, self.compute_flat = self.storage, self.flat
        if compute != self.flat.dtype:  # padded like `storage`: a ZeRO-1 run gathers its shards
            self.compute_storage = backend.xp.zeros(self.storage.size, dtype=compute)
            self.compute_flat = self.compute_storage[:offset]
        self.backend = backend
        self.sync_compute()
        self.params: dict[str, Tensor] = {}
        for s in self.spans:
            t = Tensor.wrap(self.compute_flat[s.offset : s.offset + s.size].reshape(s.shape),
                            backend, requires_grad=True)
            t.name = s.name
            t.grad = self.grad[s.offset : s.offset + s.size].reshape(s.shape)
            self.params[s.name] = t

    @property
    def compute_dtype(self) -> np.dtype:
        """The dtype the forward computes in (the parameters' own unless mixed precision)."""
        return self.compute_flat.dtype

    def sync_compute(self) -> None:
        """Cast the master parameters into the compute copy (after every update)."""
        if self.compute_flat is not self.flat:
            self.backend.kernels.cast_into(self.compute_flat, self.flat)

    def zero_grad(self) -> None:
        self.grad_storage.fill(0)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape by name (what a checkpoint must hold)."""
        return {s.name: s.shape for s in self.spans}

    def buckets(self, max_bytes: int, itemsize: int | None = None) -> list[tuple[int, int]]:
        """Consecutive whole spans grouped into (start, stop) element ranges of the buffer.

        Each range holds at most `max_bytes` (at `itemsize` bytes an element: the gradient's
        own unless it is reduced in another dtype) unless it is a single span larger than
        that, so a range's gradient is one contiguous slice that can be reduced (all-reduce)
        as soon as backward has produced it, in a few large transfers rather than one per
        tensor. No range straddles `decay_size`: the 1-D tensors at the back (every block's
        biases and LayerNorms) are ready only when backward reaches block 0, and would hold
        back the last block's matrices, the first gradients backward completes.
        """
        limit = max_bytes // (itemsize or self.flat.itemsize)  # elements
        out: list[tuple[int, int]] = []
        start = stop = 0
        for s in self.spans:
            end = s.offset + s.size
            if stop > start and (end - start > limit or s.offset == self.decay_size):
                out.append((start, stop))
                start = stop
            stop = end
        if stop > start:
            out.append((start, stop))
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies of every parameter (one transfer for the flat buffer)."""
        host = self.backend.to_host(self.flat)
        return {s.name: host[s.offset : s.offset + s.size].reshape(s.shape).copy()
                for s in self.spans}

    def load_state_dict(self, weights: dict[str, np.ndarray]) -> None:
        missing = set(self.params) - set(weights)
        if missing:
            raise ValueError(f"checkpoint lacks parameters: {', '.join(sorted(missing))}")
        wrong = [f"{s.name} {tuple(weights[s.name].shape)} (model {s.shape})"
                 for s in self.spans if tuple(weights[s.name].shape) != s.shape]
        if wrong:
            raise ValueError(f"parameter shapes differ: {'; '.join(wrong)}")
        host = np.empty(self.flat.size, dtype=self.flat.dtype)
        for s in self.spans:
            host[s.offset : s.offset + s.size] = np.asarray(weights[s.name]).ravel()
        self.flat[...] = self.backend.from_host(host)
        self.sync_compute()
