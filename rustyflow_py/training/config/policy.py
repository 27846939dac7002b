"""The frozen run policy a configuration describes, and the backend a run computes on.

Every setting that decides how kernels compute (PRECISION, FP8_SCALING, ATTENTION, GRAPH,
THREADS, CPU_JIT, LM_HEAD_CHUNK)
goes into one `RunPolicy` before any work; the run's backend is the device's view bound to it
(engine/policy.py), so no run's settings outlive it or reach another run in the process.
"""

from __future__ import annotations

from collections.abc import Callable

from ...engine.backend import Backend
from ...engine.library import get_backend
from ...engine.policy import RunPolicy
from ...engine.precision import Precision
from .config import Config


def run_policy(cfg: Config) -> RunPolicy:
    """The policy of a run configured by `cfg` (a checkpoint's stored config, for evaluation)."""
    return RunPolicy(precision=Precision.of(cfg.precision), attention=cfg.attention,
                     graph=cfg.graph, threads=cfg.threads, cpu_jit=cfg.cpu_jit,
                     fp8_scaling=cfg.fp8_scaling, head_chunk=cfg.lm_head_chunk)


def run_backend(device: str, policy: RunPolicy, say: Callable[[str], None],
                warn: Callable[[str], None]) -> Backend:
    """`device` under `policy`, its CPU numba kernels compiled now (see Backend.prepared)."""
    return get_backend(device, policy).prepared(say, warn)
