"""Model FLOPs utilisation counted the way nanoGPT's `GPT.estimate_mfu` counts it.

nanoGPT (karpathy/nanoGPT, model.py) takes the PaLM paper's estimate (appendix B):

    flops_per_token = 6 * N + 12 * L * H * Q * T

with N = `get_num_params()` (every parameter except the position table: the token embedding
stays in because, tied, it is also the LM head's weight), L layers, H heads, Q = n_embd / H
the head size and T the context (its block_size; here the sequence length, which is the
block size at the benchmark's shapes). A step of B sequences counts flops_per_token * T * B.
Using its count rather than our own (`GPT.matmul_flops_per_step`) makes the MFU figures
comparable with nanoGPT's and llm.c's, which use the same one.

The peak is the GPU's published dense figure for the GEMMs' input type, from the package's
table (`rustyflow_py.engine.peaks.KNOWN_GPUS`). A GPU not in that table gets no MFU: the
package's measured-probe fallback is a floor on the peak, and an MFU over it would read high.
"""

from __future__ import annotations

import dataclasses

from rustyflow_py.engine import peaks
from rustyflow_py.model.gpt import GPTConfig


def nanogpt_params(cfg: GPTConfig) -> int:
    """N of nanoGPT's count for rustyflow's GPT (biases everywhere, tied head): the token
    table V*E, per layer two LayerNorms (4E), QKV (3E^2 + 3E), the attention projection
    (E^2 + E) and the MLP (8E^2 + 5E), and the final LayerNorm (2E); no position table."""
    e = cfg.n_embd
    return cfg.vocab_size * e + cfg.n_layer * (12 * e * e + 13 * e) + 2 * e


def flops_per_token(cfg: GPTConfig) -> int:
    """6N + 12 * L * H * Q * T: the weights' multiply-adds forward and backward, plus the
    attention's scores and weighted sum over the whole context."""
    q = cfg.n_embd // cfg.n_head
    return 6 * nanogpt_params(cfg) + 12 * cfg.n_layer * cfg.n_head * q * cfg.seq_len


def flops_per_step(cfg: GPTConfig, batch: int) -> int:
    """A training step over `batch` sequences of `cfg.seq_len` tokens."""
    return flops_per_token(cfg) * cfg.seq_len * batch


@dataclasses.dataclass(frozen=True)
class Peak:
    """A device's dense peak for one input type, and where the figure comes from."""

    tflops: float
    compute: str  # bf16, fp16, tf32, fp32
    source: str


# a precision timed against another's peak and PyTorch rows
PEER = {"fp8": "bf16", "fp8-delayed": "bf16"}


def peak_for(device_name: str, precision: str) -> Peak | None:
    """The published dense peak of GPU `device_name` for the GEMMs of `precision`; None for a
    device the table does not know (no MFU is better than a guessed one)."""
    known = peaks.lookup(device_name)  # an NVL part is not in it: no guessed peak
    # the GEMMs' input type: mixed precision multiplies 16-bit copies; fp8 is held to the bf16
    # peak, so that its MFU and bf16's count the same FLOPs against the same figure
    compute = PEER.get(precision, precision)
    if known is None or compute not in known["tflops"]:
        return None
    return Peak(known["tflops"][compute], compute, f"{device_name}: {known['source']}")


def mfu(cfg: GPTConfig, batch: int, step_s: float, peak: Peak) -> float:
    """The share of `peak` the step's counted FLOPs reach when a step takes `step_s`."""
    if step_s <= 0:
        raise ValueError(f"a step time must be positive, got {step_s}")
    return flops_per_step(cfg, batch) / step_s / (peak.tflops * 1e12)


def describe(peaks_by_precision: dict[str, Peak | None], device_name: str) -> str:
    """The report's line saying how MFU is counted and against which peak (or why none)."""
    count = ("MFU: nanoGPT's `estimate_mfu` count, (6N + 12·L·H·Q·T) FLOPs per token × T × B "
             "per step, N = parameters less the position table")
    known = {p: k for p, k in peaks_by_precision.items() if k is not None}
    missing = sorted(p for p, k in peaks_by_precision.items() if k is None)
    parts = [f"{p}: {k.tflops:g} TFLOP/s dense {k.compute} ({k.source})"
             for p, k in sorted(known.items())]
    if missing:
        parts.append(f"{', '.join(missing)}: no MFU ({device_name} has no published "
                     "dense peak in rustyflow_py/engine/peaks.py; none is guessed)")
    return f"- {count}; peak " + "; ".join(parts)
