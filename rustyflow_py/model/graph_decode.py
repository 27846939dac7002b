"""The decode step as a CUDA graph: captured once, replayed for every token.

A step of a small model is little GPU work behind ~15 kernel launches per layer from Python
(benchmarks/results/generate-h100.md); a graph replays all of them in one launch. The step
(decode.py) reads its token ids and position from device buffers and writes fixed logits, so
one capture at the full window (attention over all SEQ_LEN cached positions, those after the
position masked) serves every position. The warm-up runs it eagerly first, so kernels
compile and libraries allocate their workspaces outside the capture. If capture fails, the
eager step is used from then on, with a warning.

Generation goes further (GraphDraws): its graph also draws the token (`next_tokens`, one
launch that reads its uniforms at a device counter and advances the step's position), so a
token is one replay with no host work in between, and the host reads the ids back AHEAD
tokens at a time while the next AHEAD run. Between tokens the device then waits neither for
Python nor for a copy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..engine.graph import CapturedStep, GraphCaptureError
from .decode import DecodeStep
from .sampling import CHUNK, Sampler

AHEAD = 16  # tokens queued between two reads of ids (what a chat reply may run past <eos>)


def capture(backend: Any, body: Callable[[], None], warn: Callable[[str], None],
            what: str) -> tuple[CapturedStep | None, float]:
    """`body` as a CUDA graph (run eagerly once before, by the caller) and the capture's
    time; None, with a warning, where it cannot be captured."""
    graph = CapturedStep(backend, body)
    start = time.perf_counter()
    try:
        graph.capture()
    except GraphCaptureError as exc:
        warn(f"WARN: {what} could not be captured as a CUDA graph ({exc}); decoding eagerly")
        return None, 0.0
    return graph, time.perf_counter() - start


class GraphDecode:
    """Runs a DecodeStep as a replayed CUDA graph, or eagerly once capture has failed."""

    def __init__(self, step: DecodeStep, warn: Callable[[str], None]) -> None:
        self.step, self.warn = step, warn
        self.full = step.cfg.seq_len
        self.graph: CapturedStep | None = None
        self.failed = False
        self.capture_s = 0.0  # the capture's time (generation's start-up line shows it)

    def __call__(self, n: int) -> None:
        """The step for the current tokens and position (n: the eager step's window)."""
        if self.graph is None and not self.failed:
            self._capture()
        if self.graph is None:
            self.step(n)
        else:
            self.graph.replay()

    def _capture(self) -> None:
        # Eager warm-up at the capture's shapes: it writes the same keys, values and logits
        # the replay below writes again for the same inputs.
        self.step(self.full)
        self.graph, self.capture_s = capture(self.step.backend, lambda: self.step(self.full),
                                             self.warn, "the decode step")
        self.failed = self.graph is None


class GraphDraws:
    """A Decoder's tokens on the GPU, each one replay of a graph that draws it from the last
    step's logits into the step's input and decodes it (the first token runs eagerly, then
    the capture). The ids come back AHEAD at a time, the next AHEAD queued before a batch is
    read.

    The uniforms are the Sampler's streams (one per sequence and token, in order). A series
    may run past where its consumer stops (a chat reply's <eos>): what it ran past is not
    kept (its uniforms stay for the next tokens; the contexts, the cache's length and the
    logits are those of the last token kept, the logits rebuilt by a step when next needed).
    """

    def __init__(self, decoder: Any, sampler: Sampler, warn: Callable[[str], None]) -> None:
        self.decoder, self.step, self.warn = decoder, decoder.step, warn
        self.sampling, self.rngs = sampler.sampling, sampler.rngs
        step, xp = self.step, self.step.xp
        self.xp, self.backend, self.rows = xp, step.backend, step.tokens.shape[0]
        self.uniforms = xp.zeros((AHEAD, self.rows), np.float64)  # (N, B) a batch's
        self.ring = xp.zeros((AHEAD, self.rows), np.int64)  # (N, B) a batch's ids
        self.count = xp.zeros(1, np.int64)  # the batch's tokens drawn so far
        # two batches in flight: pinned host copies of their ids, and events to wait for
        self.pinned = [xp.cuda.alloc_pinned_memory(self.ring.nbytes) for _ in range(2)]
        self.ids = [np.frombuffer(m, np.int64, self.ring.size).reshape(self.ring.shape)
                    for m in self.pinned]
        self.events = [xp.cuda.Event(disable_timing=True) for _ in range(2)]
        self.spare = np.empty((0, self.rows))  # (n, B) uniforms drawn, not yet used
        self.graph: CapturedStep | None = None
        self.failed = False
        self.capture_s = 0.0

    def tokens(self, logits: Any, max_tokens: int, first_alone: bool) -> Iterator[np.ndarray]:
        """The host ids (B,) of up to max_tokens tokens after `logits` (None: rebuilt), each
        appended to the decoder's contexts when yielded. first_alone: the first token (which
        compiles and captures) is yielded before any other is queued, so it can be timed."""
        d, done = self.decoder, 0
        while done < max_tokens:
            if logits is None:
                logits = self._rebuild()
            room = self.step.cfg.seq_len - len(d.contexts[0])  # steps left in the window
            if room > 0:
                n = min(max_tokens - done, room)
                yield from self._series(logits, n, first_alone and not done)
                logits, done = d.logits, done + n
            else:  # the window slides: draw alone, then re-prefill it (Decoder.feed_rows)
                host = self._draw_alone(logits)
                logits, done = d.feed_rows(host[:, None].tolist()), done + 1
                yield host

    def _series(self, logits: Any, n: int, first_alone: bool) -> Iterator[np.ndarray]:
        """n tokens inside the window, AHEAD a batch (the first alone if first_alone); each
        batch's ids are read once the next batch is queued."""
        d, step = self.decoder, self.step
        if logits is not step.logits:
            step.logits[...] = logits
        step.pos.fill(len(d.contexts[0]) - 1)  # the draw moves it to the new token's
        rest = n - first_alone
        sizes = [1] * first_alone + [AHEAD] * (rest // AHEAD)
        sizes += [rest % AHEAD] if rest % AHEAD else []
        batches = queued = kept = 0
        try:
            for j, size in enumerate(sizes):
                ahead = j if first_alone and j == 0 else min(j + 1, len(sizes) - 1)
                while batches <= ahead:
                    self._queue(batches % 2, queued, sizes[batches])
                    queued, batches = queued + sizes[batches], batches + 1
                self.events[j % 2].synchronize()
                for row in self.ids[j % 2][:size].copy():
                    for context, token in zip(d.contexts, row.tolist(), strict=True):
                        context.append(token)
                    kept += 1
                    yield row
        finally:
            if self.sampling.temperature:
                self.spare = self.spare[kept:]
            d.cache.length = len(d.contexts[0])
            d.logits = step.logits if kept == queued else None

    def _queue(self, slot: int, first: int, size: int) -> None:
        """Queue `size` tokens (the series' from `first` on) and the copy of their ids into
        pinned buffer `slot`, then its event."""
        if self.sampling.temperature:
            self.uniforms[:size] = self.backend.from_host(
                np.ascontiguousarray(self._uniforms(first + size)[first:]))
        self.count.fill(0)
        for _ in range(size):
            self._launch()
        runtime, stream = self.xp.cuda.runtime, self.backend.stream
        runtime.memcpyAsync(self.pinned[slot].ptr, self.ring.data.ptr, 8 * size * self.rows,
                            runtime.memcpyDeviceToHost, stream.ptr)
        self.events[slot].record(stream)

    def _launch(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        self._body()
        if not self.failed:  # the token just run eagerly was the warm-up
            self.graph, self.capture_s = capture(self.backend, self._body, self.warn,
                                                 "the decode loop")
            self.failed = self.graph is None

    def _body(self) -> None:
        step = self.step
        self._draw(step.logits)
        step(step.cfg.seq_len)

    def _draw(self, logits: Any) -> None:
        s, step = self.sampling, self.step
        step.kernels.next_tokens(logits, self.uniforms, self.count, step.tokens, self.ring,
                                 step.pos, s.temperature, s.top_k, s.top_p)

    def _uniforms(self, n: int) -> np.ndarray:
        """The streams' next n uniforms (n, B), drawn a chunk at a time as the Sampler draws
        them, not used up here."""
        while len(self.spare) < n:
            chunk = np.stack([rng.random(CHUNK) for rng in self.rngs], axis=1)  # (CHUNK, B)
            self.spare = np.concatenate([self.spare, chunk])
        return self.spare[:n]

    def _draw_alone(self, logits: Any) -> np.ndarray:
        """A token from `logits` with no step after it (the window is full), read back."""
        if self.sampling.temperature:
            self.uniforms[:1] = self.backend.from_host(np.ascontiguousarray(self._uniforms(1)))
            self.spare = self.spare[1:]
        self.count.fill(0)
        self._draw(logits)
        return self.backend.to_host(self.step.tokens)

    def _rebuild(self) -> Any:
        """The logits after the contexts' last tokens (a series ran past them): a step."""
        d, step = self.decoder, self.step
        step.tokens[...] = self.backend.from_host(
            np.asarray([c[-1] for c in d.contexts], np.int64))
        step.pos.fill(len(d.contexts[0]) - 1)
        step(step.cfg.seq_len)
        d.logits = step.logits
        return step.logits
