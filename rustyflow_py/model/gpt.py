"""The GPT of SPEC §6 (GPT-2 style, pre-LayerNorm, tied LM head) on the op library.

All parameters live in one flat buffer (and their gradients in another), so the optimizer,
the grad-norm and zero_grad are each one pass over memory — and one kernel on the GPU.
Decayed tensors (2-D and up) are packed first, so weight decay is a single boundary index.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..engine import ops
from ..engine.backend import get_backend
from ..engine.tensor import Tensor


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    seq_len: int
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(
                f"EMBED_DIM={self.n_embd} is not divisible by NUM_HEADS={self.n_head}"
            )


def init_weights(cfg: GPTConfig, seed: int) -> dict[str, np.ndarray]:
    """SPEC §6 initialisation on the host in float32, so every device starts identically."""
    rng = np.random.default_rng(seed)
    e, std = cfg.n_embd, 0.02
    proj_std = std / math.sqrt(2 * cfg.n_layer)

    def normal(shape: tuple[int, ...], s: float = std) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * s).astype(np.float32)

    w: dict[str, np.ndarray] = {"wte": normal((cfg.vocab_size, e)), "wpe": normal((cfg.seq_len, e))}
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        w[p + "ln_1.weight"] = np.ones(e, np.float32)
        w[p + "ln_1.bias"] = np.zeros(e, np.float32)
        w[p + "attn.c_attn.weight"] = normal((e, 3 * e))  # stored (in, out): y = x @ W
        w[p + "attn.c_attn.bias"] = np.zeros(3 * e, np.float32)
        w[p + "attn.c_proj.weight"] = normal((e, e), proj_std)
        w[p + "attn.c_proj.bias"] = np.zeros(e, np.float32)
        w[p + "ln_2.weight"] = np.ones(e, np.float32)
        w[p + "ln_2.bias"] = np.zeros(e, np.float32)
        w[p + "mlp.c_fc.weight"] = normal((e, 4 * e))
        w[p + "mlp.c_fc.bias"] = np.zeros(4 * e, np.float32)
        w[p + "mlp.c_proj.weight"] = normal((4 * e, e), proj_std)
        w[p + "mlp.c_proj.bias"] = np.zeros(e, np.float32)
    w["ln_f.weight"] = np.ones(e, np.float32)
    w["ln_f.bias"] = np.zeros(e, np.float32)
    return w


class ParameterBuffer:
    """Named parameters as views into one flat array; gradients likewise.

    `decay_size` elements at the front belong to tensors with >= 2 dims (weight decay on).
    """

    def __init__(self, weights: dict[str, np.ndarray], device: str, dtype: Any) -> None:
        backend = get_backend(device)
        xp = backend.xp
        names = sorted(weights, key=lambda n: weights[n].ndim < 2)  # stable: decayed first
        total = sum(weights[n].size for n in names)
        host = np.empty(total, dtype=dtype)
        offset, spans = 0, {}
        for n in names:
            size = weights[n].size
            host[offset : offset + size] = weights[n].ravel()
            spans[n] = (offset, size)
            offset += size
        self.flat = backend.from_host(host)
        self.grad = xp.zeros_like(self.flat)
        self.decay_size = sum(weights[n].size for n in names if weights[n].ndim >= 2)
        self.params: dict[str, Tensor] = {}
        for n in names:
            start, size = spans[n]
            t = Tensor(self.flat[start : start + size].reshape(weights[n].shape),
                       requires_grad=True, name=n)
            t.grad = self.grad[start : start + size].reshape(weights[n].shape)
            self.params[n] = t
        self.backend = backend

    def zero_grad(self) -> None:
        self.grad.fill(0)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies of every parameter (one transfer for the flat buffer)."""
        host = self.backend.to_host(self.flat)
        out, offset = {}, 0
        for n, t in self.params.items():
            out[n] = host[offset : offset + t.data.size].reshape(t.shape).copy()
            offset += t.data.size
        return out

    def load_state_dict(self, weights: dict[str, np.ndarray]) -> None:
        missing = set(self.params) - set(weights)
        if missing:
            raise ValueError(f"checkpoint lacks parameters: {', '.join(sorted(missing))}")
        wrong = [f"{n} {tuple(weights[n].shape)} (model {t.shape})"
                 for n, t in self.params.items() if tuple(weights[n].shape) != t.shape]
        if wrong:
            raise ValueError(f"parameter shapes differ: {'; '.join(wrong)}")
        host = np.concatenate([np.asarray(weights[n], self.flat.dtype).ravel()
                               for n in self.params])
        self.flat[...] = self.backend.from_host(host)


class GPT:
    """Token + position embedding, pre-LN blocks, final LN, LM head tied to the embedding."""

    def __init__(
        self, cfg: GPTConfig, device: str = "cpu", seed: int = 0, dtype: Any = np.float32
    ) -> None:
        self.cfg = cfg
        self.buffer = ParameterBuffer(init_weights(cfg, seed), device, dtype)
        self.p = self.buffer.params
        self.training = True

    @property
    def device(self) -> str:
        return self.buffer.backend.name

    def num_params(self) -> int:
        return int(self.buffer.flat.size)

    def __call__(self, idx: Tensor, targets: Tensor | None = None) -> Tensor:
        """Loss (scalar) when targets are given, else logits (B, T, V)."""
        cfg, p = self.cfg, self.p
        b, t = idx.shape
        if t > cfg.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than SEQ_LEN={cfg.seq_len}")
        drop = cfg.dropout if self.training else 0.0
        x = ops.embedding(p["wte"], idx) + ops.index(p["wpe"], slice(0, t))  # (B, T, E)
        x = ops.dropout(x, drop)
        for i in range(cfg.n_layer):
            x = self._block(x, f"h.{i}.", drop)
        x = ops.layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
        h = ops.reshape(x, (b * t, cfg.n_embd))  # (B*T, E)
        if targets is None:
            logits = ops.matmul(h, p["wte"], transpose_b=True)  # (B*T, V)
            return ops.reshape(logits, (b, t, cfg.vocab_size))
        return ops.lm_head_cross_entropy(h, p["wte"], targets)  # logits never returned

    def _block(self, x: Tensor, prefix: str, drop: float) -> Tensor:
        p = {k[len(prefix):]: v for k, v in self.p.items() if k.startswith(prefix)}
        h = ops.layer_norm(x, p["ln_1.weight"], p["ln_1.bias"])
        qkv = ops.matmul(h, p["attn.c_attn.weight"]) + p["attn.c_attn.bias"]  # (B, T, 3E)
        a = ops.causal_self_attention(qkv, self.cfg.n_head, drop)  # (B, T, E)
        a = ops.matmul(a, p["attn.c_proj.weight"]) + p["attn.c_proj.bias"]
        x = x + ops.dropout(a, drop)
        h = ops.layer_norm(x, p["ln_2.weight"], p["ln_2.bias"])
        f = ops.gelu(ops.matmul(h, p["mlp.c_fc.weight"]), p["mlp.c_fc.bias"])  # (B, T, 4E)
        f = ops.matmul(f, p["mlp.c_proj.weight"]) + p["mlp.c_proj.bias"]  # (B, T, E)
        return x + ops.dropout(f, drop)

    def matmul_flops_per_step(self, batch: int, seq_len: int) -> float:
        """FLOPs of the step's matmuls (forward + backward = 3x forward)."""
        c, n = self.cfg, batch * seq_len
        e = c.n_embd
        per_layer = 2 * n * e * (3 * e + e + 8 * e) + 2 * 2 * batch * c.n_head * seq_len**2 * (
            e // c.n_head
        )
        return 3.0 * (c.n_layer * per_layer + 2 * n * e * c.vocab_size)
