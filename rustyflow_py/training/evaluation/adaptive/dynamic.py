"""Dynamic evaluation (Krause et al., 2018, "Dynamic Evaluation of Neural Sequence Models"):
the model reads the text in consecutive segments; each segment is scored with the current
weights, and only then does the model take a gradient step on that segment.

The update is the paper's plain SGD variant with decay toward the original weights theta_0
(not its RMS-normalised one):

    theta_i = theta_{i-1} - lr * grad L(s_i; theta_{i-1}) + decay * (theta_0 - theta_{i-1})

L being the mean NLL of the segment's tokens. A segment is the scored part of an evaluation
window: windows of SEQ_LEN tokens advancing `segment` tokens, each scoring its last
`segment` (with SEQ_LEN - segment tokens of context before them). With B streams, the B
rows' segments at one position are scored together and make one step. Dropout stays off;
the weights are restored afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ....engine.tensor import Tensor
from ....errors import ConfigError
from ....model.gpt import GPT
from ....model.params import ParameterBuffer
from ..evaluate import exp, protocol, scored_tokens, windows, within_budget
from .ranges import check_range


@dataclasses.dataclass(frozen=True)
class DynamicSettings:
    """The hyperparameters (--dynamic-lr, --dynamic-decay, --dynamic-segment); one out of
    range is a ConfigError naming its option."""

    lr: float = 0.01  # SGD step size on a segment's mean NLL
    decay: float = 0.0  # the pull toward the original weights, per step
    segment: int = 0  # tokens scored per step; 0: the model's SEQ_LEN

    name = "dynamic"

    def __post_init__(self) -> None:
        check_range("--dynamic-lr", self.lr, 0)
        check_range("--dynamic-decay", self.decay, 0, 1)
        check_range("--dynamic-segment", self.segment, 0)

    def check(self, seq_len: int) -> None:
        """A ConfigError when a segment is longer than the model's windows."""
        if self.segment > seq_len:
            raise ConfigError(f"--dynamic-segment {self.segment} is longer than the model's "
                              f"SEQ_LEN={seq_len}: pass 1 to {seq_len} (0: SEQ_LEN)")

    def words(self, seq_len: int) -> str:
        return (f"dynamic evaluation: SGD lr {self.lr:g}, decay {self.decay:g}, "
                f"segment {self.stride(seq_len, 0)}")

    def stride(self, seq_len: int, eval_stride: int) -> int:
        """The windows advance one segment (the checkpoint's EVAL_STRIDE is not used)."""
        return self.segment or seq_len

    def evaluate(self, model: GPT, stream: Any, seq_len: int, stride: int, budget: int = 0,
                 advance: Callable[[int], None] | None = None) -> dict[str, Any]:
        return dynamic_perplexity(model, stream, seq_len, self, budget, advance)


def sgd_with_decay(buffer: ParameterBuffer, original: Any, lr: float, decay: float) -> None:
    """One step of the update above on the flat buffer (its gradient already computed)."""
    buffer.flat += decay * (original - buffer.flat) - lr * buffer.grad
    buffer.sync_compute()


def dynamic_perplexity(model: GPT, stream: Any, seq_len: int, settings: DynamicSettings,
                       budget: int = 0,
                       advance: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Perplexity under dynamic evaluation over an uploaded (B, N) split (the first `budget`
    tokens, 0 = all); the model's weights are as before when it returns."""
    buffer = model.buffer
    backend, xp = buffer.backend, buffer.backend.xp
    rows, stride = stream.shape[0], settings.stride(seq_len, 0)
    original = buffer.flat.copy()
    total, scored = xp.zeros((), dtype=np.float64), 0
    was_training, model.training = model.training, False
    try:
        for start, first in within_budget(windows(stream.shape[1], seq_len, stride), rows,
                                          seq_len, budget):
            x = xp.ascontiguousarray(stream[:, start : start + seq_len])  # (B, T)
            y = xp.ascontiguousarray(stream[:, start + 1 : start + seq_len + 1])
            buffer.zero_grad()
            loss = model(Tensor.wrap(x, backend), Tensor.wrap(y, backend), score_from=first)
            total += loss.data.astype(np.float64) * (seq_len - first)  # scored, then learnt
            scored += seq_len - first
            loss.backward()
            sgd_with_decay(buffer, original, settings.lr, settings.decay)
            if advance is not None:
                advance(rows * (seq_len - first))
    finally:
        buffer.flat[...] = original
        buffer.sync_compute()
        buffer.zero_grad()
        model.training = was_training
    nll = float(backend.to_host(total)) / scored
    return {"perplexity": exp(nll), "nll": nll, "tokens": scored * rows,
            "of": scored_tokens(stream.shape, seq_len, stride)[1],
            "protocol": protocol(seq_len, stride)}
