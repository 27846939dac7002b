"""The GPT (GPT-2 style: pre-LayerNorm, tied LM head) on the op library, written once.

The same forward trains (autograd, dropout), evaluates, and encodes generation's prompts:
with a KV cache the block code is unchanged, and only its attention becomes
`ops.cached_attention`, which appends the new keys and values to the cache and attends over
every cached position. Each token after that is decode.py's step, on the same weights.

All parameters live in one flat buffer (params.py), so the optimizer, the grad-norm and
zero_grad are each one pass over memory.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Protocol

import numpy as np

from ..engine import ops
from ..engine.backend import Backend
from ..engine.regularize import locked_dropout, smoothed
from ..engine.tensor import Tensor
from .init import Init
from .params import ParameterBuffer

LN_EPS = 1e-5  # GPT-2's LayerNorm epsilon


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """The model's shape, in GPT-2's names."""

    vocab_size: int
    seq_len: int
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0  # the rate of every site whose own rate below is negative
    embd_dropout: float = -1.0  # element-wise, after the token + position embedding sum
    attn_dropout: float = -1.0  # the attention probabilities
    resid_dropout: float = -1.0  # each block's two branches, before the residual add
    word_dropout: float = 0.0  # whole vocabulary rows of the input embedding
    locked_dropout: bool = False  # embedding and residual sites: one mask per sequence
    label_smoothing: float = 0.0  # of the training loss only (engine/regularize.py)

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(
                f"EMBED_DIM={self.n_embd} is not divisible by NUM_HEADS={self.n_head}"
            )

    def rate(self, own: float) -> float:
        """A site's dropout rate: its own, or DROPOUT's when its own is negative (unset)."""
        return self.dropout if own < 0 else own

    @property
    def any_dropout(self) -> bool:
        return max(self.rate(self.embd_dropout), self.rate(self.attn_dropout),
                   self.rate(self.resid_dropout), self.word_dropout) > 0


# Dropout stream ids: one per call site, so no two sites draw the same mask.
WORD_SITE, EMBD_SITE = 0, 1


def block_sites(layer: int) -> tuple[int, int, int]:
    """Layer `layer`'s stream ids: attention probabilities, attention and MLP branches."""
    return 2 + 3 * layer, 3 + 3 * layer, 4 + 3 * layer


def weight_inits(cfg: GPTConfig, seed: int) -> dict[str, Init]:
    """GPT-2's initialisation (N(0, 0.02); residual projections scaled by 1/sqrt(2L)) as
    descriptions the parameter buffer realises on its own device (model/init.py): every
    device starts a seed from the same weights, and none is built on the host first."""
    e, std = cfg.n_embd, 0.02
    proj_std = std / math.sqrt(2 * cfg.n_layer)
    streams = itertools.count()

    def normal(shape: tuple[int, ...], s: float = std) -> Init:
        return Init(shape, std=s, seed=seed, stream=next(streams))

    def const(size: int, value: float) -> Init:
        return Init((size,), fill=value)

    w: dict[str, Init] = {"wte": normal((cfg.vocab_size, e)), "wpe": normal((cfg.seq_len, e))}
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        w[p + "ln_1.weight"] = const(e, 1.0)
        w[p + "ln_1.bias"] = const(e, 0.0)
        w[p + "attn.c_attn.weight"] = normal((e, 3 * e))  # stored (in, out): y = x @ W
        w[p + "attn.c_attn.bias"] = const(3 * e, 0.0)
        w[p + "attn.c_proj.weight"] = normal((e, e), proj_std)
        w[p + "attn.c_proj.bias"] = const(e, 0.0)
        w[p + "ln_2.weight"] = const(e, 1.0)
        w[p + "ln_2.bias"] = const(e, 0.0)
        w[p + "mlp.c_fc.weight"] = normal((e, 4 * e))
        w[p + "mlp.c_fc.bias"] = const(4 * e, 0.0)
        w[p + "mlp.c_proj.weight"] = normal((4 * e, e), proj_std)
        w[p + "mlp.c_proj.bias"] = const(e, 0.0)
    w["ln_f.weight"] = const(e, 1.0)
    w["ln_f.bias"] = const(e, 0.0)
    return w


def init_weights(cfg: GPTConfig, seed: int) -> dict[str, np.ndarray]:
    """The initial weights as host float32 arrays (for tests and the PyTorch peers)."""
    return {n: init.on_host() for n, init in weight_inits(cfg, seed).items()}


def hidden_matrices(buffer: ParameterBuffer) -> tuple[str, ...]:
    """The 2-D weights inside the transformer blocks (attention c_attn/c_proj, MLP
    c_fc/c_proj): what Muon optimises. Not the embeddings (wte, tied to the LM head, and
    wpe), the biases or LayerNorm."""
    return tuple(s.name for s in buffer.spans if s.name.startswith("h.") and len(s.shape) == 2)

class ModelShape(Protocol):
    """The fields of a run configuration that shape the model (training's Config has them;
    model/ sits below training/ and does not import it)."""

    seq_len: int
    num_layers: int
    num_heads: int
    embed_dim: int
    dropout: float
    embd_dropout: float
    attn_dropout: float
    resid_dropout: float
    word_dropout: float
    locked_dropout: bool
    label_smoothing: float
    seed: int


@dataclasses.dataclass
class KVCache:
    """The keys and values a GPT has computed so far, so each new token costs one position.

    `keys` and `values` are (L, B, H, SEQ_LEN, D) on the model's device, of which the first
    `length` positions are filled; a forward with the cache fills its T tokens' positions
    next and advances `length`. Setting `length` to 0 empties it.
    """

    keys: Any
    values: Any
    length: int = 0


class GPT:
    """Token + position embedding, pre-LN blocks, final LN, LM head tied to the embedding."""

    def __init__(
        self, cfg: GPTConfig, device: str | Backend = "cpu", seed: int = 0,
        dtype: Any = np.float32,
        pad_to: int = 1, compute: Any = None,
    ) -> None:
        self.cfg = cfg
        self.buffer = ParameterBuffer(weight_inits(cfg, seed), device, dtype, pad_to, compute)
        self.p = self.buffer.params
        # each block's parameters by their name inside it, looked up once, not every step
        self.layers = [{n[len(f"h.{i}."):]: t for n, t in self.p.items()
                        if n.startswith(f"h.{i}.")} for i in range(cfg.n_layer)]
        self.training = True
        # Dropout draws from (seed, step): the model's own step counter, unless a call passes
        # the randomness of its step (the step runner's reads the optimizer's device step
        # counter, so each step, eager or replayed, gets masks of its own).
        self.rng = ops.Randomness(seed, self.buffer.backend.xp.zeros((), dtype=np.int32))

    @property
    def device(self) -> str:
        return self.buffer.backend.name

    def num_params(self) -> int:
        return int(self.buffer.flat.size)

    def new_cache(self, batch: int = 1) -> KVCache:
        """An empty KV cache for `batch` sequences of up to SEQ_LEN tokens."""
        c = self.cfg
        xp = self.buffer.backend.xp
        shape = (c.n_layer, batch, c.n_head, c.seq_len, c.n_embd // c.n_head)
        keys = xp.zeros(shape, dtype=self.buffer.compute_dtype)  # (L, B, H, SEQ_LEN, D)
        return KVCache(keys, xp.zeros_like(keys))

    def __call__(
        self, idx: Tensor, targets: Tensor | None = None, cache: KVCache | None = None,
        score_from: int = 0, hidden: bool = False, rng: ops.Randomness | None = None,
    ) -> Tensor:
        """Loss (scalar) when targets are given, else logits (B, T, V), or with `hidden` the
        final LayerNorm's output (B, T, E) that the LM head reads (the neural cache's keys).
        `score_from` > 0 averages the loss over positions score_from.. only (sliding-window
        evaluation: the earlier positions are context scored by the previous window).
        `rng` is where a training call's dropout masks come from (the step runner passes its
        step's: the optimizer's step counter and the batch shard); default the model's own.

        With a KV cache (generation: no targets, no dropout, no backward) the T tokens
        continue the cached positions, and only the last one's logits (B, 1, V) are computed:
        sampling needs nothing else, and the tied LM head is the largest product of a forward.
        """
        cfg, p = self.cfg, self.p
        b, t = idx.shape
        start = 0
        if cache is not None:
            if targets is not None:
                raise ValueError("a KV cache is for generation: call the model without targets")
            start = cache.length
        if start + t > cfg.seq_len:
            raise ValueError(f"sequence of {start + t} tokens is longer than "
                             f"SEQ_LEN={cfg.seq_len}")
        train = self.training and cache is None
        rng = self.rng if rng is None else rng  # where this call's dropout masks come from
        tok = ops.embedding(p["wte"], idx)  # (B, T, E)
        if train:
            tok = ops.word_dropout(tok, idx, cfg.vocab_size, cfg.word_dropout, rng,
                                   WORD_SITE)
        x = tok + ops.index(p["wpe"], slice(start, start + t))  # (B, T, E)
        if train:
            x = self._dropout(x, cfg.rate(cfg.embd_dropout), rng, EMBD_SITE)
        for i in range(cfg.n_layer):
            x = self._block(x, i, train, cache, rng)
        if cache is not None:
            cache.length += t
            x, t = ops.index(x, (slice(None), slice(t - 1, t))), 1  # (B, 1, E)
        if score_from:
            x, t = ops.index(x, (slice(None), slice(score_from, t))), t - score_from
            targets = Tensor.wrap(targets.data[:, score_from:], targets.backend)  # (B, T')
        # x is the last block's MLP output where nothing came between (see _block)
        last_mlp = (cfg.n_layer > 0 and cache is None and not score_from
                    and not (train and cfg.rate(cfg.resid_dropout) > 0))
        x = ops.layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], LN_EPS, from_linear=last_mlp)
        if hidden:
            return x  # (B, T, E)
        h = ops.reshape(x, (b * t, cfg.n_embd))  # (B*T, E)
        if targets is None:
            logits = ops.matmul(h, p["wte"], transpose_b=True)  # (B*T, V)
            return ops.reshape(logits, (b, t, cfg.vocab_size))
        loss = ops.lm_head_cross_entropy(h, p["wte"], targets)  # logits never returned
        return smoothed(loss, h, p["wte"], targets, cfg.label_smoothing) if train else loss

    def _dropout(self, x: Tensor, p: float, rng: ops.Randomness, site: int) -> Tensor:
        """Dropout of an embedding or residual site: element-wise, or with LOCKED_DROPOUT one
        (B, 1, E) mask per sequence, shared by its positions."""
        if self.cfg.locked_dropout:
            return locked_dropout(x, p, rng, site)
        return ops.dropout(x, p, rng, site)

    def _block(self, x: Tensor, i: int, train: bool, cache: KVCache | None,
               rng: ops.Randomness) -> Tensor:
        p, cfg = self.layers[i], self.cfg
        attn_p = cfg.rate(cfg.attn_dropout) if train else 0.0
        resid_p = cfg.rate(cfg.resid_dropout) if train else 0.0
        attn_site, attn_out_site, mlp_out_site = block_sites(i)
        # Without dropout each branch joins the residual stream inside its last GEMM, so the
        # LayerNorms after block 0's first take their x from a Linear or MLP (from_linear)
        h = ops.layer_norm(x, p["ln_1.weight"], p["ln_1.bias"], LN_EPS, feeds_linear=True,
                           from_linear=i > 0 and resid_p == 0)
        qkv = ops.linear(h, p["attn.c_attn.weight"], p["attn.c_attn.bias"])  # (B, T, 3E)
        if cache is None:
            a = ops.causal_self_attention(qkv, cfg.n_head, attn_p, rng, attn_site)  # (B, T, E)
        else:  # the new positions join layer i's cache and attend over all of it
            a = ops.cached_attention(qkv, cache.keys[i], cache.values[i], cache.length,
                                     cfg.n_head)  # (B, T, E)
        # Each branch joins the residual stream x: inside its last GEMM (x as its C) when
        # there is no dropout between them, else by an add after the dropout.
        w, b = p["attn.c_proj.weight"], p["attn.c_proj.bias"]
        if resid_p > 0:
            x = x + self._dropout(ops.linear(a, w, b), resid_p, rng, attn_out_site)
        else:
            x = ops.linear(a, w, b, residual=x)  # (B, T, E)
        h = ops.layer_norm(x, p["ln_2.weight"], p["ln_2.bias"], LN_EPS, feeds_linear=True,
                           from_linear=resid_p == 0)
        mlp = (h, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"], p["mlp.c_proj.weight"],
               p["mlp.c_proj.bias"])  # (B, T, E), through (B, T, 4E)
        if resid_p > 0:
            return x + self._dropout(ops.mlp(*mlp), resid_p, rng, mlp_out_site)
        return ops.mlp(*mlp, residual=x)

    def matmul_flops_per_step(self, batch: int, seq_len: int) -> float:
        """FLOPs of the step's matmuls (forward + backward = 3x forward)."""
        c, n = self.cfg, batch * seq_len
        e = c.n_embd
        per_layer = 2 * n * e * (3 * e + e + 8 * e) + 2 * 2 * batch * c.n_head * seq_len**2 * (
            e // c.n_head
        )
        return 3.0 * (c.n_layer * per_layer + 2 * n * e * c.vocab_size)


def build_model(shape: ModelShape, vocab_size: int, device: str | Backend = "cpu",
                dtype: Any = np.float32, pad_to: int = 1, compute: Any = None) -> GPT:
    """The GPT a run configuration describes, initialised from its seed: what training builds,
    and what a checkpoint's weights are loaded into for evaluation and generation. `device`
    is a device's name or a run's backend (bound to its policy); `pad_to` and `compute`: see
    ParameterBuffer."""
    cfg = GPTConfig(vocab_size, shape.seq_len, shape.num_layers, shape.num_heads,
                    shape.embed_dim, shape.dropout, shape.embd_dropout, shape.attn_dropout,
                    shape.resid_dropout, shape.word_dropout, shape.locked_dropout,
                    shape.label_smoothing)
    return GPT(cfg, device, shape.seed, dtype, pad_to, compute)
