"""OPTIMIZER and its keys: which keys each optimizer reads, the optimizer a config builds, and
how a run names it (banner, run record, log block)."""

from __future__ import annotations

from typing import Any

from ...engine.precision import bfloat16
from ...model.gpt import hidden_matrices
from ...model.optim import (
    SGD,
    Adadelta,
    Adagrad,
    Adam,
    AdamW,
    Lamb,
    Muon,
    Optimizer,
    RMSprop,
    Schedule,
)
from ...model.params import ParameterBuffer
from ...model.wd_schedule import DecaySchedule
from .config import Config

# Every optimizer reads the schedule and the clip (LEARNING_RATE, WARMUP_STEPS, MIN_LR_RATIO,
# GRAD_CLIP); these are the keys it reads besides.
OPTIMIZER_KEYS: dict[str, tuple[str, ...]] = {
    "adamw": ("BETA1", "BETA2", "ADAM_EPS", "WEIGHT_DECAY"),
    "adam": ("BETA1", "BETA2", "ADAM_EPS", "WEIGHT_DECAY"),
    "sgd": ("MOMENTUM", "NESTEROV", "WEIGHT_DECAY"),
    "lamb": ("BETA1", "BETA2", "ADAM_EPS", "WEIGHT_DECAY"),
    "rmsprop": ("RMSPROP_ALPHA", "ADAM_EPS", "MOMENTUM", "CENTERED", "WEIGHT_DECAY"),
    "adagrad": ("INITIAL_ACCUMULATOR", "ADAGRAD_EPS", "WEIGHT_DECAY"),
    "adadelta": ("RHO", "ADADELTA_EPS", "WEIGHT_DECAY"),
    "muon": ("MUON_LR", "MUON_MOMENTUM", "MUON_NESTEROV", "NS_STEPS", "BETA1", "BETA2",
             "ADAM_EPS", "WEIGHT_DECAY"),
}
SCHEDULE_KEYS = ("LEARNING_RATE", "WARMUP_STEPS", "MIN_LR_RATIO", "GRAD_CLIP")

MUON_SPLIT = "muon (2-D hidden weights) + adamw (embeddings, biases, LayerNorm)"


def relevant_keys(optimizer: str) -> tuple[str, ...]:
    """The keys that change what `optimizer` computes (the schedule's included)."""
    return (*SCHEDULE_KEYS, *OPTIMIZER_KEYS[optimizer])


def _read_keys(cfg: Config) -> tuple[str, ...]:
    """The keys the optimizer reads, with the weight-decay schedule's when it is on."""
    scheduled = ("WD_SCHEDULE", "WD_FINAL") if cfg.wd_schedule != "constant" else ()
    stored = ("ADAM_STATE_DTYPE",) if cfg.adam_state_dtype != "fp32" else ()
    return (*OPTIMIZER_KEYS[cfg.optimizer], *scheduled, *stored)


def settings(cfg: Config) -> dict[str, Any]:
    """The optimizer's settings by lower-case key name (the run record's optimizer_settings)."""
    return {k.lower(): getattr(cfg, k.lower()) for k in (*SCHEDULE_KEYS, *_read_keys(cfg))}


def describe(cfg: Config) -> str:
    """What OPTIMIZER runs and the keys it reads, as the banner shows it (with Muon's split
    of the parameters): 'adamw (BETA1=0.9, BETA2=0.95, ADAM_EPS=1e-08, WEIGHT_DECAY=0.1)'."""
    name = MUON_SPLIT if cfg.optimizer == "muon" else cfg.optimizer
    values = [f"{k}={_value(getattr(cfg, k.lower()))}" for k in _read_keys(cfg)]
    return f"{name} ({', '.join(values)})"


def _value(v: object) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:g}" if isinstance(v, float) else str(v)


def make_optimizer(cfg: Config, buffer: ParameterBuffer, total_steps: int) -> Optimizer:
    """The optimizer and learning-rate schedule `cfg` asks for, with its weight-decay
    schedule when WD_SCHEDULE is not constant (the config allows it for adamw and muon)."""
    optimizer = _optimizer(cfg, buffer, total_steps)
    if cfg.wd_schedule != "constant":
        optimizer.decay_schedule = DecaySchedule(cfg.wd_schedule, cfg.weight_decay,
                                                 cfg.wd_final, total_steps)
    return optimizer


def _optimizer(cfg: Config, buffer: ParameterBuffer, total_steps: int) -> Optimizer:
    """The optimizer itself (decay 0 in its kernels when a schedule applies it apart)."""
    def schedule(lr: float) -> Schedule:
        return Schedule(lr, cfg.warmup_steps, total_steps, cfg.min_lr_ratio)

    main, betas, clip = schedule(cfg.learning_rate), (cfg.beta1, cfg.beta2), cfg.grad_clip
    wd = cfg.weight_decay if cfg.wd_schedule == "constant" else 0.0
    opt = cfg.optimizer
    # Adam's moments: the parameters' dtype, or bf16 (the config allows it for adamw, adam
    # and muon, on the GPU)
    state = bfloat16("ADAM_STATE_DTYPE=bf16") if cfg.adam_state_dtype == "bf16" else None
    if opt == "sgd":
        return SGD(buffer, main, cfg.momentum, cfg.nesterov, wd, clip)
    if opt == "adam":
        return Adam(buffer, main, betas, cfg.adam_eps, wd, clip, state)
    if opt == "lamb":
        return Lamb(buffer, main, betas, cfg.adam_eps, wd, clip)
    if opt == "rmsprop":
        return RMSprop(buffer, main, cfg.rmsprop_alpha, cfg.adam_eps, cfg.momentum,
                       cfg.centered, wd, clip)
    if opt == "adagrad":
        return Adagrad(buffer, main, cfg.initial_accumulator, cfg.adagrad_eps, wd, clip)
    if opt == "adadelta":
        return Adadelta(buffer, main, cfg.rho, cfg.adadelta_eps, wd, clip)
    if opt == "muon":
        return Muon(buffer, main, schedule(cfg.muon_lr), hidden_matrices(buffer),
                    cfg.muon_momentum, cfg.muon_nesterov, cfg.ns_steps, betas, cfg.adam_eps,
                    wd, clip, state_dtype=state)
    return AdamW(buffer, main, betas, cfg.adam_eps, wd, clip, state)
