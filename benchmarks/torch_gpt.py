"""RustyFlow's GPT written with stock PyTorch modules: the reference RustyFlow is held to.

It exists only for the parity tests and `vs_pytorch.py` (the package never imports torch).
Parameter names match RustyFlow's, so one mapping covers loading weights and reading back
gradients: RustyFlow stores Linear weights (in, out) for `y = x @ W`, nn.Linear (out, in),
and RustyFlow's embeddings are bare tensors ("wte") where torch's are modules ("wte.weight").
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def causal_attention(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """Causal multi-head attention on a fused (B, T, 3E) QKV tensor -> (B, T, E).

    The split is RustyFlow's: [q | k | v] along the last axis, each E wide, heads contiguous.
    """
    b, t, e3 = qkv.shape
    q, k, v = qkv.view(b, t, 3, n_head, e3 // 3 // n_head).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
    return a.transpose(1, 2).reshape(b, t, e3 // 3)


class Block(nn.Module):
    """Pre-LN block: x + Attn(LN1(x)), then x + MLP(LN2(x))."""

    def __init__(self, n_head: int, n_embd: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.ModuleDict(
            {"c_attn": nn.Linear(n_embd, 3 * n_embd), "c_proj": nn.Linear(n_embd, n_embd)}
        )
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(
            {"c_fc": nn.Linear(n_embd, 4 * n_embd), "c_proj": nn.Linear(4 * n_embd, n_embd)}
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = causal_attention(self.attn["c_attn"](self.ln_1(x)), self.n_head)
        x = x + self.attn["c_proj"](a)
        h = F.gelu(self.mlp["c_fc"](self.ln_2(x)), approximate="tanh")
        return x + self.mlp["c_proj"](h)


class TorchGPT(nn.Module):
    """Token + position embedding, pre-LN blocks, final LN, LM head tied to the embedding."""

    def __init__(self, vocab: int, seq_len: int, n_layer: int, n_head: int, n_embd: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(seq_len, n_embd)
        self.h = nn.ModuleList(Block(n_head, n_embd) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over all B*T positions."""
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head: h @ wte.T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))

    def _mapped(self) -> dict[str, tuple[torch.Tensor, bool]]:
        """RustyFlow name -> (torch parameter, whether the layouts are transposed)."""
        linear = {id(m.weight) for m in self.modules() if isinstance(m, nn.Linear)}
        return {
            name.removesuffix(".weight") if name in ("wte.weight", "wpe.weight") else name:
            (p, id(p) in linear)
            for name, p in self.named_parameters()
        }

    @torch.no_grad()
    def load_from_rustyflow(self, weights: dict[str, np.ndarray]) -> None:
        """Copy RustyFlow weights (e.g. `nn.init_weights(cfg, seed)`) into this model."""
        mapped = self._mapped()
        if set(mapped) != set(weights):
            raise ValueError(f"parameter names differ: {sorted(set(mapped) ^ set(weights))}")
        for name, (p, transposed) in mapped.items():
            w = np.asarray(weights[name], dtype=np.float32)
            p.copy_(torch.from_numpy(np.ascontiguousarray(w.T if transposed else w)))

    def to_rustyflow(self, grads: bool = False) -> dict[str, np.ndarray]:
        """Every parameter (or its gradient) in RustyFlow's names and layouts, host float32."""
        out = {}
        for name, (p, transposed) in self._mapped().items():
            a = (p.grad if grads else p).detach().cpu().numpy()
            out[name] = a.T if transposed else a
        return out


def cosine_lr(step: int, lr: float, warmup: int, total: int, min_ratio: float) -> float:
    """RustyFlow's schedule in floats for the 1-based `step`: linear warm-up, cosine decay."""
    if step <= warmup:
        return lr * step / max(warmup, 1)
    progress = min(1.0, (step - warmup) / max(total - warmup, 1))
    floor = lr * min_ratio
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_adamw(model: nn.Module, lr: float, weight_decay: float = 0.1,
               fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW as RustyFlow sets it: decay on tensors with >= 2 dims only, betas (0.9, 0.95)."""
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)
