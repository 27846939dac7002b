"""One decode step for a batch of sequences: raw arrays through the backend's kernels.

The model's own forward (gpt.py) builds a Tensor and a Function per op so that it can be
differentiated; a new token needs none of that, and at one position per sequence that
bookkeeping, not arithmetic, is the cost of a token. This step reads the same weight arrays
and calls the same kernels (LayerNorm, the fused linear layers, GEMMs), without autograd.

Its inputs and output are fixed buffers: `tokens` (B,) and `pos` (1,), both on the device,
and `logits` (B, V). Each layer's attention is one kernel call (`decode_attention`): it writes
the new key and value in place at `pos` into the KV cache the model allocated for the whole
window (L, B, H, SEQ_LEN, D) and attends over the cached positions up to `pos`. The GPU
kernel reads `pos` on the device, so nothing in the step depends on a host value and it is
captured once as a CUDA graph and replayed per token (graph_decode.py); the reference
formulation attends over the first `n` positions with those after `pos` masked (`n` =
SEQ_LEN in a graph, pos + 1 eagerly).

On the CPU with the numba kernels (float32), CpuDecodeStep goes one level lower still: a
token's dozens of small kernel calls through the kernel table (dispatch, shape checks, fresh
outputs, BLAS's threads set and reset around each product) cost about as much as its
arithmetic outside the products, so it calls the same compiled kernels and the same NumPy
products itself, into buffers made once, with BLAS's threads set once for all of the step's
products. The arithmetic, and so every logit, is the kernel set's to the bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..engine.ops.gemm.cpu import STREAMED_ROWS
from .gpt import GPT, LN_EPS, KVCache


def _direct(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The kernels' GEMM runner, untimed (the profiler's runner times each GEMM)."""
    return fn(*args, **kwargs)


class DecodeStep:
    """logits (B, V) of `tokens` (B,) at position `pos` over the cache, for B sequences."""

    def __init__(self, model: GPT, cache: KVCache) -> None:
        cfg = model.cfg
        backend = model.buffer.backend
        self.backend, self.cfg, self.cache = backend, cfg, cache
        self.xp, self.kernels = backend.xp, backend.kernels
        self.w = {name: t.data for name, t in model.p.items()}
        self.layers = [{name: t.data for name, t in layer.items()} for layer in model.layers]
        batch, xp = cache.keys.shape[1], self.xp
        self.scale = 1.0 / math.sqrt(cfg.n_embd // cfg.n_head)
        self.tokens = xp.zeros(batch, dtype=np.int64)  # (B,) input
        self.pos = xp.zeros(1, dtype=np.int64)  # (1,) input: the position being written
        self.logits = xp.zeros((batch, cfg.vocab_size), dtype=self.w["wte"].dtype)  # output

    def __call__(self, n: int) -> None:
        """Fill `logits` for `tokens` at `pos`, attending over cache positions 0..n-1."""
        w, k = self.w, self.kernels
        x = w["wte"][self.tokens] + w["wpe"][self.pos]  # (B, E)
        for i, p in enumerate(self.layers):
            h = k.layernorm_forward(x, p["ln_1.weight"], p["ln_1.bias"], LN_EPS)[0]
            qkv = k.linear(h, p["attn.c_attn.weight"], p["attn.c_attn.bias"], False,
                           _direct)[0]  # (B, 3E)
            a = k.decode_attention(qkv, self.cache.keys[i], self.cache.values[i], self.pos,
                                   self.scale, n)  # (B, E)
            x = x + k.linear(a, p["attn.c_proj.weight"], p["attn.c_proj.bias"], False,
                             _direct)[0]
            h = k.layernorm_forward(x, p["ln_2.weight"], p["ln_2.bias"], LN_EPS)[0]
            f = k.linear(h, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"], True, _direct)[0]
            x = x + k.linear(f, p["mlp.c_proj.weight"], p["mlp.c_proj.bias"], False,
                             _direct)[0]  # (B, E)
        h = k.layernorm_forward(x, w["ln_f.weight"], w["ln_f.bias"], LN_EPS)[0]
        k.matmul(h, w["wte"], transpose_b=True, out=self.logits)  # (B, V)


class CpuDecodeStep(DecodeStep):
    """DecodeStep on the CPU for float32 weights with the numba kernels, and fewer than
    STREAMED_ROWS sequences (the products the kernel set leaves whole to BLAS's threads).

    Why it exists: a CPU token is a few milliseconds, and the kernel table's dispatch, checks
    and fresh outputs around each small kernel, with BLAS's threads set around each product,
    were a large share of it (benchmarks/results/generate-cpu-2core.md). So this step calls
    the same compiled kernels and products itself, into buffers made once, and sets BLAS's
    threads once a step. It writes the block's forward a third time (gpt.py, DecodeStep):
    tests/test_cpu_decode.py holds it to DecodeStep bit for bit, so a change to the block
    changes all three."""

    def __init__(self, model: GPT, cache: KVCache) -> None:
        super().__init__(model, cache)
        rows, e = self.logits.shape[0], self.cfg.n_embd
        self.jit = self.kernels.jit
        self.x, self.h, self.z, self.attended = (np.empty((rows, e), np.float32)
                                                 for _ in range(4))  # (B, E) each
        self.mean, self.rstd = (np.empty((rows, 1), np.float32) for _ in range(2))  # (B, 1)
        self.qkv = np.empty((rows, 3 * e), np.float32)  # (B, 3E)
        self.pre, self.act = (np.empty((rows, 4 * e), np.float32) for _ in range(2))  # (B, 4E)

    @staticmethod
    def fits(model: GPT, batch: int) -> bool:
        """Whether this step runs `model` for `batch` sequences."""
        backend = model.buffer.backend
        return (backend.kind == "cpu" and backend.kernels.jit is not None
                and model.p["wte"].data.dtype == np.float32 and batch < STREAMED_ROWS)

    def __call__(self, n: int) -> None:
        """As DecodeStep (the same kernels, in the same order); `n` is not needed."""
        w, jit, mm, add = self.w, self.jit, np.matmul, np.add
        x, h, z, qkv, pre, act = self.x, self.h, self.z, self.qkv, self.pre, self.act
        pos = int(self.pos[0])
        add(w["wte"][self.tokens], w["wpe"][self.pos], out=x)  # (B, E)
        with self.kernels.blas_threaded():
            for i, p in enumerate(self.layers):
                jit.layernorm.layernorm_forward(x, p["ln_1.weight"], p["ln_1.bias"], LN_EPS,
                                                h, self.mean, self.rstd)
                add(mm(h, p["attn.c_attn.weight"], out=qkv), p["attn.c_attn.bias"], out=qkv)
                jit.attention.decode_attention(qkv, self.cache.keys[i], self.cache.values[i],
                                               pos, self.scale, self.attended)
                add(mm(self.attended, p["attn.c_proj.weight"], out=z), p["attn.c_proj.bias"],
                    out=z)
                add(x, z, out=x)
                jit.layernorm.layernorm_forward(x, p["ln_2.weight"], p["ln_2.bias"], LN_EPS,
                                                h, self.mean, self.rstd)
                jit.gelu.gelu_forward(mm(h, p["mlp.c_fc.weight"], out=pre), p["mlp.c_fc.bias"],
                                      act)
                add(mm(act, p["mlp.c_proj.weight"], out=z), p["mlp.c_proj.bias"], out=z)
                add(x, z, out=x)
            jit.layernorm.layernorm_forward(x, w["ln_f.weight"], w["ln_f.bias"], LN_EPS, h,
                                            self.mean, self.rstd)
            mm(h, w["wte"].T, out=self.logits)  # (B, V)


def decode_step(model: GPT, cache: KVCache) -> DecodeStep:
    """The decode step for `model` over `cache`: CpuDecodeStep where it fits."""
    fits = CpuDecodeStep.fits(model, cache.keys.shape[1])
    return CpuDecodeStep(model, cache) if fits else DecodeStep(model, cache)
