"""The next token on the GPU (sampling.cu): one launch per token, in every sampling mode.

Why kernels of their own: as CuPy array ops a draw is about 40 launches a token (two of
them sorts of the whole vocabulary), each a Python call, and CuPy's argmax of one row is a
single block reading it one element per thread at a time. At batch 1 that, not the decode
step, set the speed of sampled generation.

A draw spreads each row over several blocks (a row of GPT-2's 50,257 logits over 25), which
meet between the passes: the maximum, a radix select of the k-th largest logit (top-k), a
radix select of top-p's threshold by probability mass (no sort), and the inverse CDF. The
blocks of a row wait for each other, so all of a launch's blocks must be on the GPU at once:
at most one per multiprocessor is started, and a batch too large for that takes one block a
row. The meetings are most of a draw's time at batch 1 (benchmarks/results/generate-h100.md);
with top-k on (k <= THREADS) a row takes one block, which meets no other: it sorts only the
candidates for the k largest (about k of them) and draws among those.

`next_tokens` is the same launch for generation's decode loop: it reads its uniforms at a
device counter and writes the ids into the decode step's input, and its last block advances
the counter and the step's position, so the loop captures draw and step in one CUDA graph.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import cuda_build
from .reference import SamplingReference

THREADS = 1024  # sampling.cu's block size (it needs exactly 32 warps)
PER_THREAD = 2  # logits per thread a block of a draw takes: the row's blocks follow from it
DIGITS, MAX_ROUNDS = 256, 8  # a radix select's histogram, and its passes over 64-bit keys
_DEFINES = (f"-DTHREADS={THREADS}",)
_SAMPLING = cuda_build.source(__file__, "sampling.cu",
                              cuda_build.dtype_defines(np.float32) + _DEFINES)
_STATES: dict[tuple[int, int], tuple[Any, ...]] = {}  # (rows, device) -> sample_rows' state


@functools.cache
def _multiprocessors(device: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])


def blocks_per_row(vocab: int, rows: int, multiprocessors: int, top_k: int = 0) -> int:
    """How many blocks draw from each row: 1 with top-k on (sampling.cu's top_k_draw);
    else about PER_THREAD logits a thread (measured fastest for top-p among 2, 4, 8 and 16:
    benchmarks/results/generate-h100.md; its exps spread over more multiprocessors outweigh a
    wider barrier), and no more blocks in
    all than multiprocessors (every block of a row must run at once); 1 when the batch
    alone fills the GPU."""
    if 0 < top_k <= THREADS:
        return 1
    wanted = -(-vocab // (THREADS * PER_THREAD))
    return max(1, min(wanted, multiprocessors // rows))


class CudaSampling(SamplingReference):

    def argmax_rows(self, logits: Any) -> Any:
        logits = self.xp.ascontiguousarray(logits)
        ids = self.xp.empty(logits.shape[0], dtype=np.int64)
        self._argmax(logits, ids, (np.int32(0), ids, ids, ids))
        return ids

    def sample_rows(self, logits: Any, u: Any, temperature: float, top_k: int,
                    top_p: float) -> Any:
        if u.dtype != np.float64 or not u.flags.c_contiguous:
            u = self.xp.ascontiguousarray(u, dtype=np.float64)
        ids = self.xp.empty(logits.shape[0], dtype=np.int64)
        self._draw(logits, u, ids, temperature, top_k, top_p, (np.int32(0), ids, ids, ids))
        return ids

    def next_tokens(self, logits: Any, uniforms: Any, count: Any, tokens: Any, ring: Any,
                    pos: Any, temperature: float, top_k: int, top_p: float) -> None:
        """One launch: the kernels' decode-loop form (sampling.cu's `advance`)."""
        loop = (np.int32(uniforms.shape[0]), count, ring, pos)
        if temperature == 0:
            self._argmax(self.xp.ascontiguousarray(logits), tokens, loop)
        else:
            self._draw(logits, uniforms, tokens, temperature, top_k, top_p, loop)

    def _argmax(self, logits: Any, ids: Any, loop: tuple[Any, ...]) -> None:
        """argmax_rows into ids (B,); `loop`: the decode loop's (n_u, count, ring, pos), n_u
        0 for a plain call (the pointers are then unused)."""
        b, v = logits.shape
        _SAMPLING.typed("argmax_rows", logits.dtype, defines=_DEFINES)(
            (b,), (THREADS,), (logits, ids, np.int32(v), *loop,
                               self._row_state(b, logits.device.id)[-1]))

    def _draw(self, logits: Any, u: Any, ids: Any, temperature: float, top_k: int,
              top_p: float, loop: tuple[Any, ...]) -> None:
        """sample_rows into ids (B,); `loop` as _argmax's."""
        if not logits.flags.c_contiguous:  # (a check costs less than the call it saves)
            logits = self.xp.ascontiguousarray(logits)
        b, v = logits.shape
        blocks = blocks_per_row(v, b, _multiprocessors(logits.device.id), top_k)
        *state, done = self._row_state(b, logits.device.id)
        _SAMPLING.typed("sample_rows", logits.dtype, defines=_DEFINES)(
            (blocks, b), (THREADS,), (logits, u, ids, np.int32(v), np.float64(temperature),
                                      np.int32(top_k), np.float64(top_p), *state, *loop, done))

    def _row_state(self, rows: int, device: int) -> tuple[Any, ...]:
        """sampling.cu's row_state for `rows` rows, then `advance`'s count of finished blocks:
        made zeroed once per batch size and device (a launch leaves its barrier counters and
        that count as it found them), then reused."""
        state = _STATES.get((rows, device))
        if state is None:
            xp, most = self.xp, _multiprocessors(device)
            state = (xp.zeros(2 * rows, np.uint32), xp.zeros(rows * most, np.float64),
                     xp.zeros(rows * most, np.float64),
                     xp.zeros(rows * MAX_ROUNDS * DIGITS, np.uint32),
                     xp.zeros(rows * MAX_ROUNDS * DIGITS, np.float64), xp.zeros(1, np.uint32))
            _STATES[(rows, device)] = state
        return state
