"""Does the model fit? Estimated before anything is allocated, so that a model too big for
the machine is refused at once with the numbers, instead of building billions of parameters
on the host for minutes and then being killed without a word.

The estimate counts what the run allocates: parameters (and their compute copy in mixed
precision), gradients, optimizer state, the activations one step keeps for backward at this
batch, sequence length and precision, and on the GPU the CUDA graph's private pool. It is an
estimate, fitted to measured peaks, not a bound: a model refused here needs more than there
is, one accepted close to the limit may still fail on a fragmented or busy device (the
out-of-memory error then names the sizes).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from ...errors import TrainingError
from ..config.config import Config

# float32 arrays of the parameters' size each optimizer keeps (muon: momentum, plus adamw's
# two moments for the rest; counted as two in all)
_STATE_COPIES = {"adamw": 2, "adam": 2, "lamb": 2, "adadelta": 2, "muon": 2, "adagrad": 1}
# Activations kept per layer and token, in units of EMBED_DIM values, and the CUDA graph's
# private pool as a share of them (1/10): fitted to the peaks measured for the medium shape
# in benchmarks/results/h100-mixed-precision-medium.md (fp32, tf32, bf16 and fp16; graph
# replay reserved little more than eager), which the estimate exceeds by under a fifth.
_PER_LAYER = 14
_GRAPH_SHARE = 10
_ITEMSIZE = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
GiB = 2**30


def num_params(cfg: Config, vocab: int) -> int:
    """The GPT's parameter count: embeddings, L blocks (attention, MLP, two LayerNorms), final
    LayerNorm; the LM head is tied to the token embedding."""
    e = cfg.embed_dim
    return vocab * e + cfg.seq_len * e + cfg.num_layers * (12 * e * e + 13 * e) + 2 * e


def _state_copies(cfg: Config) -> int:
    if cfg.optimizer == "sgd":
        return int(cfg.momentum > 0)
    if cfg.optimizer == "rmsprop":
        return 1 + int(cfg.centered) + int(cfg.momentum > 0)
    return _STATE_COPIES[cfg.optimizer]


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Bytes by part; `model` parts shrink with EMBED_DIM/NUM_LAYERS, `step` parts with
    BATCH_SIZE/SEQ_LEN."""

    params: int
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        return ", ".join(f"{name} {_gib(n)}" for name, n in self.parts.items() if n)


def estimate(cfg: Config, vocab: int, gpu: bool, training: bool = True,
             world_size: int = 1) -> Estimate:
    """What a run (or, `training` False, an evaluation) of `cfg` allocates on its device."""
    p = num_params(cfg, vocab)
    store = 8 if cfg.precision == "fp64" else 4
    compute = _ITEMSIZE[cfg.precision] if gpu or cfg.precision == "fp64" else 4
    parts = {"parameters": p * store}
    if compute != store:
        parts["compute copy"] = p * compute
    b, t, e, h = cfg.batch_size, cfg.seq_len, cfg.embed_dim, cfg.num_heads
    flash = (gpu and cfg.attention != "materialized"
             and cfg.precision in ("tf32", "bf16", "fp16", "fp8"))
    # one layer's T x T scores and probabilities at a time (the fp32 peak measured no
    # higher than tf32's fused attention), or none
    scores = 0 if flash else 2 * h * t
    # per token: what each layer keeps for backward; and the logits with their gradient, of
    # the rows the LM head makes at a time (LM_HEAD_CHUNK)
    rows = min(cfg.lm_head_chunk or b * t, b * t)
    per_token = cfg.num_layers * _PER_LAYER * e + scores + 2 * e
    activations = (b * t * per_token + 2 * vocab * rows) * compute
    if training:
        parts["gradients"] = p * store
        if gpu and world_size > 1 and cfg.grad_reduce_dtype == "bf16":
            parts["bf16 gradient copy"] = p * 2  # what the collectives carry (data_parallel.py)
        state = 2 if cfg.adam_state_dtype == "bf16" else 4  # bytes a moment
        parts["optimizer state"] = -(-_state_copies(cfg) * p * state // world_size)
        if cfg.ema_decay > 0:  # model/ema.py: the average, in the storage dtype
            parts["weight average"] = p * store
        parts["activations"] = activations
        if rows < b * t:  # a chunked head adds each chunk's dW into a float32 sum
            parts["LM head's dW sum"] = vocab * e * 4
        if gpu and cfg.graph != "off":
            parts["CUDA graph pool"] = activations // _GRAPH_SHARE
        if gpu and cfg.precision == "fp8":  # the largest GEMM's operand codes, both layouts
            parts["FP8 codes"] = 2 * b * t * max(vocab, 4 * e)
    else:
        parts["activations"] = activations // max(cfg.num_layers, 1)  # no backward: one layer
    return Estimate(p, parts)


def host_init_bytes(params: int) -> int:
    """Host memory a GPU run needs to initialise its parameters (float32, on the host, so
    every device starts from the same weights)."""
    return params * 4


def available_host_bytes() -> int | None:
    """Memory the host can still give this process: MemAvailable, capped by a cgroup limit
    (containers, batch jobs); None where neither can be read."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(used))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def free_device_bytes(backend: Any) -> int | None:
    """Free memory of the backend's GPU (CUDA's memGetInfo), plus what CuPy's pool holds
    free; None on the CPU."""
    if backend.kind != "gpu":
        return None
    cupy = backend.xp
    with cupy.cuda.Device(backend.index):
        free, _total = cupy.cuda.runtime.memGetInfo()
    pool = cupy.get_default_memory_pool()
    return int(free) + int(pool.free_bytes())


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"


def check_fits(cfg: Config, vocab: int, backend: Any, what: str = "training",
               world_size: int = 1) -> None:
    """TrainingError, with the estimate, the limit and what to reduce, when `what`
    ("training", or "evaluation" for eval/generate) of `cfg` cannot fit."""
    gpu = backend.kind == "gpu"
    est = estimate(cfg, vocab, gpu, what == "training", world_size)
    shape = (f"L{cfg.num_layers} E{cfg.embed_dim} (vocabulary {vocab}), "
             f"{est.params / 1e6:,.1f} M parameters")
    checks = [("host memory", host_init_bytes(est.params) if gpu else est.total,
               available_host_bytes(), "available")]
    if gpu:
        checks.insert(0, (f"GPU memory ({backend.hardware()})", est.total,
                          free_device_bytes(backend), "free"))
    for where, need, limit, kind in checks:
        if limit is None or need <= limit:
            continue
        step = est.parts.get("activations", 0) + est.parts.get("CUDA graph pool", 0)
        half = gpu and cfg.precision in ("fp32", "tf32", "fp64")
        reduce = ("BATCH_SIZE or SEQ_LEN (the activations)"
                  + (", or use PRECISION=bf16 (half-size activations)" if half else "")
                  if step > need / 2 else "EMBED_DIM or NUM_LAYERS (the model)")
        detail = est.describe() if need == est.total else "its float32 initial weights"
        raise TrainingError(
            f"the model does not fit: {what} {shape} needs about {_gib(need)} of {where} "
            f"({detail}), but {_gib(limit)} is {kind}: reduce {reduce}")
