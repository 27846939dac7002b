"""The run record: what a finished (or stopped) run reports, built from its parts and the loop's
state.

The record's shape is `record_schema.RunRecord`; this module only fills it in. Times are this
process's: a resumed run counts its own steps over its own time, so tokens/s stays true.
Tokens/s is the counted steps' tokens over the training time of the run's clock (clock.py),
the time its epoch times are made of; a data-parallel run adds every rank's figures, gathered
at the end (rank_tables.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import numpy as np

from ...engine import peaks
from ...engine.backend import Backend
from ...model.gpt import GPTConfig
from ...reporting.curves import MAX_POINTS, evenly_spaced, sample
from ...reporting.record_schema import RunRecord
from ...reporting.text import plural
from ..config.config import Config
from ..config.optimizers import settings as optimizer_settings
from ..evaluation.evaluate import protocol
from ..run.parts import RunParts
from ..run.rank_tables import spread, throughput
from ..run.state import LoopState


def build_record(parts: RunParts, state: LoopState, status: str, message: str | None,
                 train_time: float, ckpt: str | None,
                 ranks: list[dict[str, Any]] | None = None) -> RunRecord:
    """The record of the run of `parts` whose loop ended with `status` and `state`; `ranks`:
    every rank's figures (rank_tables.gather_figures) in a data-parallel run."""
    cfg, m, runner, history = parts.cfg, parts.model.cfg, parts.runner, parts.history
    steps_done = len(history.losses)
    steps_here = max(history.pos.step - state.start_step, 0)
    # the training steps' own time, as the epoch times count it: no evaluation, checkpoint
    # writes or start-up (nor the steps run inside it), nothing between or after the epochs
    steps_time, timed = parts.clock.trained
    diverged = status == "failed"
    tokens_per_s = (timed * parts.tokens_per_step / steps_time
                    if steps_time > 0 and timed and not diverged else None)
    world, shards, epoch_times = parts.world, parts.shards, history.epoch_times
    avg_epoch = sum(epoch_times) / len(epoch_times) if epoch_times else None
    step_time = steps_time / max(timed, 1)
    return {
        "version": 1,
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "status": status,
        "device": parts.device,
        "device_requested": cfg.device,
        "fallback_reason": parts.fallback,
        "hardware": parts.backend.hardware(),
        "backend": parts.backend.describe(),
        "dataset": cfg.dataset,
        "seed": cfg.seed,
        "data": parts.data,
        "model": {"layers": m.n_layer, "heads": m.n_head, "embed": m.n_embd,
                  "seq_len": m.seq_len, "batch": cfg.batch_size, "vocab": m.vocab_size,
                  "params": parts.model.num_params()},
        "precision": cfg.precision,
        "fp8_scaling": cfg.fp8_scaling if cfg.precision == "fp8" else None,
        # each tensor the captured step casts to FP8, with its last amax and scale
        "fp8_tensors": parts.backend.kernels.fp8_tensors(),
        "optimizer": cfg.optimizer,
        "optimizer_settings": optimizer_settings(cfg),
        "regularisation": _regularisation(cfg, m),
        "graph": runner.captured is not None,
        # what computed attention (cuDNN's, the own fused kernels, or materialised): ATTENTION
        # =auto picks, and where cuDNN is missing it falls back
        "attention": parts.backend.kernels.attention_path(
            parts.model.buffer.compute_dtype, m.n_embd // m.n_head, m.seq_len,
            m.rate(m.attn_dropout) > 0),
        "epochs": len(epoch_times),
        "epochs_planned": cfg.num_epochs,
        "steps": steps_done,
        "steps_here": steps_here,
        "steps_per_epoch": parts.steps_per_epoch,
        "train_time_s": train_time,
        "eval_time_s": runner.phases["eval"],
        "checkpoint_time_s": runner.phases["checkpoint"],  # the final save's included
        "startup": _startup(parts),
        "steps_time_s": steps_time,
        "timed_steps": timed,
        "avg_epoch_time_s": avg_epoch,
        # each whole epoch's time, unrounded: the console prints two decimals, too coarse for
        # a steady-state rate of epochs of about a second
        "epoch_times_s": list(epoch_times),
        "no_extrapolation": diverged,
        "tokens_per_s": tokens_per_s,
        "parallel": {
            "world_size": world.size, "grad_accum_steps": shards.accum,
            "effective_batch": cfg.batch_size * shards.count,
            "shard_optimizer": cfg.shard_optimizer and world.distributed,
            "launcher": world.launcher,
            "tokens_per_s_per_rank": tokens_per_s / world.size if tokens_per_s else None,
            "bucket_mb": cfg.bucket_mb,
            "buckets": len(getattr(shards.sync, "buckets", ())),
            "grad_reduce_dtype": (cfg.grad_reduce_dtype if parts.reduce_dtype is not None
                                  else "fp32"),
            **({"ranks": throughput(ranks)} if ranks else {}),
        },
        "loss_scale": _loss_scale(parts),
        "val_ppl": history.val_ppl,
        "test_ppl": state.test_ppl,
        **_per_word(parts),
        "test_ppl_of": state.test_ppl_of,
        "best_val_ppl": history.best_val_ppl,
        "best_step": history.best_step,
        "best_checkpoint": parts.best_path if history.best_step is not None else None,
        "early_stopped": bool(state.early_stopped),
        "eval_protocol": protocol(cfg.seq_len, cfg.eval_stride),
        "eval_tokens": {split: list(n) for split, n in parts.evaluator.counts.items()},
        "final_loss": next((x for x in reversed(history.losses) if math.isfinite(x)), None),
        "checkpoint": ckpt,
        "message": message,
        # none when no step was profiled (profiling off, a run stopped before its first
        # profiled step or sample, a graph profile CUPTI refused)
        "profile": (_profile(parts, steps_done, step_time, ranks)
                    if parts.profiler is not None and parts.profiler.steps else None),
        "curves": _curves(parts),
    }


def _regularisation(cfg: Config, m: GPTConfig) -> dict[str, Any]:
    """What regularised the run, each dropout site at the rate it ran with (DROPOUT's where
    its own key was unset): runs that differ only here are otherwise indistinguishable."""
    return {"embd_dropout": m.rate(m.embd_dropout), "attn_dropout": m.rate(m.attn_dropout),
            "resid_dropout": m.rate(m.resid_dropout), "word_dropout": m.word_dropout,
            "locked_dropout": m.locked_dropout, "random_offsets": cfg.random_offsets,
            "label_smoothing": m.label_smoothing, "ema_decay": cfg.ema_decay,
            "ema_start": cfg.ema_start, "average_last_k": cfg.average_last_k}


def _per_word(parts: RunParts) -> dict[str, Any]:
    """A subword run's tokenizer and its perplexities per word of the text (val_ppl and
    test_ppl are per token); nothing for a word-level run, whose tokens are the words."""
    tokenizer = parts.corpus.tokenizer
    if tokenizer is None:
        return {}
    words = parts.evaluator.word_ppl
    return {"tokenizer": {"kind": tokenizer.kind, "vocab": len(tokenizer),
                          "sha256": tokenizer.sha256, "words": parts.corpus.words},
            "val_ppl_word": words.get("valid"), "test_ppl_word": words.get("test")}


def _startup(parts: RunParts) -> dict[str, Any] | None:
    """The GPU start-up (warm-up step with kernel compilation, graph capture); None on the CPU,
    whose numba kernels compile before the run starts."""
    if parts.backend.kind != "gpu":
        return None
    return {**parts.runner.startup, "steps": parts.clock.startup_steps}


def _loss_scale(parts: RunParts) -> dict[str, Any] | None:
    """A float16 run's final loss scale and how many steps it skipped; None otherwise."""
    scaler = parts.optimizer.loss_scaler
    return None if scaler is None else scaler.state(parts.backend.to_host)


def _curves(parts: RunParts) -> dict[str, Any]:
    """The loss at evenly spaced steps, the learning rate at the same steps (the schedule is a
    function of the step, so it is computed here on the host, never read from the device), and
    the validation perplexity at every validation, each thinned to MAX_POINTS. Six significant
    digits are plenty for a plot and keep the log line short."""
    losses, schedule = parts.losses, parts.optimizer.schedule
    steps = [i + 1 for i in evenly_spaced(len(losses))]  # losses[i] is step i + 1's
    return {
        "limit": MAX_POINTS,
        "losses": len(losses),
        "loss": [[s, _digits(losses[s - 1])] for s in steps
                 if math.isfinite(losses[s - 1])],  # (an fp16 step skipped for overflow)
        "lr": [[s, _digits(float(schedule(s)))] for s in steps],
        "val_ppl": [[int(s), _digits(v)] for s, v in sample(parts.history.val_curve)],
    }


def _digits(x: float) -> float:
    return float(f"{x:.6g}")


def _profile(parts: RunParts, steps: int, step_time: float,
             ranks: list[dict[str, Any]] | None) -> dict[str, Any]:
    prof, runner, mode = parts.profiler, parts.runner, parts.profile_mode
    gpu = parts.backend.kind == "gpu"
    phases = dict(runner.phases)
    if gpu:  # device time per phase from the ops
        phases.update({k: v for k, v in prof.phase_times().items() if k in phases})
    out: dict[str, Any] = {
        "mode": mode,
        "profiled_steps": prof.steps,
        "ops": prof.ops(),
        "phases": phases,
        "transfers": {**parts.ledger.steps(), "steps": steps},
        "memory": runner.memory(),
    }
    if mode == "graph" and runner.sampler is not None:
        sampling = runner.sampler.summary()
        out.update({
            "timing": "cupti-graph",
            "note": (f"device times of {plural(sampling['samples'], 'sampled CUDA-graph replay')}"
                     " of the training step (CUPTI kernel records, each kernel tagged with its "
                     "op at capture)"),
            "profiled_time_s": sampling.get("span_s", 0.0),
            "device_busy_s": sampling.get("busy_s"),
            "sampling": sampling,
            "step_wall_s": step_time,
        })
    elif gpu:
        out.update({
            "timing": "cuda-events",
            "note": ((f"EAGER WINDOW, not the step that runs (training replays a CUDA graph; "
                      f"{parts.profile_fallback}): " if parts.profile_fallback else
                      "EAGER WINDOW, not the step that runs (training replays a CUDA graph): "
                      if runner.captured is not None else
                      "eager steps (GRAPH=off: the step that runs): ")
                     + f"per-op device times from CUDA events over {prof.steps} eager steps "
                     "after 1 warm-up step"),
            "profiled_time_s": runner.profiled_wall,
            "host_launch_s": runner.window_host,
            "device_busy_s": prof.total(),
        })
    else:
        floor = matmul_floor(parts.backend, parts.model, parts.cfg.batch_size,
                             parts.cfg.seq_len, step_time)
        out.update({"timing": "wall", "note": "per-op wall times of every step",
                    "profiled_time_s": runner.profiled_wall, "matmul_floor": floor})
    across = spread(ranks) if ranks else None
    if across is not None:
        out["ranks"] = across
    out["peaks"] = peaks.of(parts.backend, parts.precision.compute, parts.cfg.precision,
                            (out.get("matmul_floor") or {}).get("gflops"))
    return out


def matmul_floor(backend: Backend, model: Any, batch: int, seq_len: int,
                 step_time: float) -> dict[str, float]:
    """The step's matmul FLOPs at this machine's measured GEMM rate."""
    cfg = model.cfg
    gflops = measure_gemm_gflops(backend.kernels.matmul, batch * seq_len, cfg.n_embd,
                                 cfg.vocab_size, model.buffer.flat.dtype)
    flops = model.matmul_flops_per_step(batch, seq_len)
    return {"gflops": gflops, "flops_per_step": flops,
            "floor_s_per_step": flops / (gflops * 1e9), "step_s": step_time}


def measure_gemm_gflops(matmul: Callable[[Any, Any], Any], m: int, k: int, n: int,
                        dtype: Any, seconds: float = 0.3) -> float:
    """GEMM rate of the kernels' own matmul (all its threads) on an (m, k) x (k, n) product,
    like the LM head's: the fastest of the calls made in `seconds`, so that other work on a
    shared machine slows the measurement as little as possible (a floor measured slow would
    sit above the real step time)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    matmul(a, b)  # warm-up
    fastest, start = math.inf, time.perf_counter()
    while time.perf_counter() - start < seconds or fastest == math.inf:
        call = time.perf_counter()
        matmul(a, b)
        fastest = min(fastest, time.perf_counter() - call)
    return 2.0 * m * k * n / fastest / 1e9
