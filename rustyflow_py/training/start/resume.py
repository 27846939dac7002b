"""Resuming a run: the checkpoint must fit this run before anything is loaded from it.

Some keys must match for a resume to mean anything (the data, the model's shape, the
optimizer's kind); others may change, but then the run no longer continues exactly, and a
warning names them. The rest (logging, devices, paths) never changes what is computed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from ...data import fingerprint
from ...errors import CheckpointError, TrainingError
from ..config.config import KEYS, Config
from ..config.optimizers import OPTIMIZER_KEYS, relevant_keys
from ..outputs import checkpoint
from ..outputs.ownership import new_run_id

# CENTERED changes which state RMSprop keeps (as MOMENTUM 0 <-> > 0 does: restore names it).
SHAPE_KEYS = ("DATASET", "TOKENIZER", "SEQ_LEN", "EMBED_DIM", "NUM_HEADS", "NUM_LAYERS",
              "OPTIMIZER", "PRECISION", "CENTERED")
MATH_KEYS = ("NUM_EPOCHS", "LEARNING_RATE", "DROPOUT", "EMBD_DROPOUT", "ATTN_DROPOUT",
             "RESID_DROPOUT", "WORD_DROPOUT", "WEIGHT_DECAY", "BETA1", "BETA2",
             "ADAM_EPS", "MOMENTUM", "NESTEROV", "GRAD_CLIP", "WARMUP_STEPS", "MIN_LR_RATIO",
             "SEED", "RMSPROP_ALPHA", "ADAGRAD_EPS", "RHO", "ADADELTA_EPS", "MUON_LR",
             "MUON_MOMENTUM", "MUON_NESTEROV", "NS_STEPS", "EMA_DECAY", "EMA_START",
             "AVERAGE_LAST_K", "WD_SCHEDULE", "WD_FINAL", "LOCKED_DROPOUT", "LABEL_SMOOTHING",
             "RANDOM_OFFSETS")
# Only sets the state a run starts from: on a resume the saved state wins, so no warning.
START_KEYS = ("INITIAL_ACCUMULATOR",)


@dataclasses.dataclass
class Position:
    """Where training stands: completed steps, epoch, and batch index within the epoch."""

    step: int = 0
    epoch: int = 0
    batch: int = 0


@dataclasses.dataclass
class History:
    """What a run has done so far, saved with its checkpoint."""

    pos: Position = dataclasses.field(default_factory=Position)
    losses: list[float] = dataclasses.field(default_factory=list)  # every step's loss
    epoch_times: list[float] = dataclasses.field(default_factory=list)
    val_ppl: float | None = None
    epoch_elapsed: float = 0.0  # seconds of the current epoch spent before the checkpoint
    val_curve: list[list[float]] = dataclasses.field(default_factory=list)  # [step, ppl]
    best_val_ppl: float | None = None  # the best validation so far, and its step
    best_step: int | None = None
    stale_evals: int = 0  # validations since the best (early stopping counts these)
    run_id: str = dataclasses.field(default_factory=new_run_id)  # kept by every resume

    def validated(self, ppl: float, patience: int) -> tuple[bool, str]:
        """Record a validation at the current step: whether it is the best so far, and why
        the run should stop early ("" to go on: PATIENCE 0 never stops it)."""
        step = self.pos.step
        self.val_ppl = ppl
        self.val_curve.append([step, ppl])
        if math.isfinite(ppl) and (self.best_val_ppl is None or ppl < self.best_val_ppl):
            self.best_val_ppl, self.best_step, self.stale_evals = ppl, step, 0
            return True, ""
        self.stale_evals += 1
        if not patience or self.stale_evals < patience:
            return False, ""
        best = (f"best {self.best_val_ppl:.2f} at step {self.best_step}"
                if self.best_val_ppl is not None else "none was finite")
        return False, (f"early-stopped at step {step}: no better validation in "
                       f"{self.stale_evals} evaluations (PATIENCE={patience}; {best})")

    def to_meta(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.pos), "losses": self.losses,
                "epoch_times": self.epoch_times, "val_ppl": self.val_ppl,
                "epoch_elapsed": self.epoch_elapsed, "val_curve": self.val_curve,
                "best_val_ppl": self.best_val_ppl, "best_step": self.best_step,
                "stale_evals": self.stale_evals, "run_id": self.run_id}


_COUNTS = ("step", "epoch", "batch", "stale_evals")
_NUMBERS = ("val_ppl", "epoch_elapsed", "best_val_ppl", "best_step")
_LISTS = ("losses", "epoch_times", "val_curve")


def _bad_history_field(t: dict[str, Any]) -> str | None:
    """The first field of a checkpoint's saved history whose type is wrong (None if none)."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    for name in _COUNTS:
        v = t.get(name, 0)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            return name
    for name in _NUMBERS:
        if t.get(name) is not None and not number(t[name]):
            return name
    for name in _LISTS:
        v = t.get(name, [])
        if not isinstance(v, list) or not all(
                number(x) or (isinstance(x, list) and all(map(number, x))) for x in v):
            return name
    return None


def check_data(path: str, stored: Any, current: dict[str, Any], dataset: str,
               allow: bool, warn: Callable[[str], None]) -> None:
    """The checkpoint trained on the tokens this run would continue on (data.fingerprint):
    else TrainingError with both fingerprints, or with `allow` (--allow-data-change) a
    warning. A checkpoint that records none (an older rustyflow's) cannot be checked: said."""
    agrees = fingerprint.same(stored, current)
    if agrees:
        return
    if agrees is None:
        warn(f"WARN: --resume {path}: the checkpoint records no fingerprint of its training "
             f"data (written by an older rustyflow), so a change of {dataset}'s training text "
             f"cannot be detected")
        return
    what = (f"the checkpoint trained on {fingerprint.describe(stored)}, {dataset}'s training "
            f"split is now {fingerprint.describe(current)}")
    if allow:
        warn(f"WARN: --allow-data-change: {what}; continuing on the new data")
        return
    raise TrainingError(f"--resume {path}: the training data changed: {what}; resume with "
                        f"the data it trained on, or pass --allow-data-change to continue on "
                        f"this data")


def global_batch(config: dict[str, Any], world_size: int) -> tuple[int, str]:
    """The streams of one optimizer step, and how they are made up."""
    b, a = config["BATCH_SIZE"], config["GRAD_ACCUM_STEPS"]
    return b * a * world_size, (f"BATCH_SIZE={b} x GRAD_ACCUM_STEPS={a} x {world_size} "
                                f"process{'es' if world_size > 1 else ''}")


def restore(path: str, cfg: Config, vocab: list[str], buffer: Any, optimizer: Any,
            warn: Callable[[str], None], world_size: int = 1,
            averager: Any = None, data: dict[str, Any] | None = None,
            allow_data_change: bool = False) -> History:
    """Load `path` into `buffer` and `optimizer` after checking it fits; its history.

    The number of processes may change on a resume, as long as a step's global batch (its
    streams, hence the data order) stays the same."""
    ckpt = checkpoint.Checkpoint(path, flag="--resume")
    mine = cfg.to_dict()
    # a checkpoint from before a key existed ran with its default
    saved = {**{k: key.default for k, key in KEYS.items()}, **ckpt.config}
    shape = [k for k in SHAPE_KEYS if saved.get(k) != mine[k]]
    if shape:
        diff = ", ".join(f"{k}={saved.get(k)} (checkpoint) vs {mine[k]}" for k in shape)
        raise TrainingError(f"--resume {path}: the checkpoint does not match this run: {diff}")
    (theirs, how), (ours, here) = (global_batch(saved, int(ckpt.meta.get("world_size", 1))),
                                   global_batch(mine, world_size))
    if theirs != ours:
        raise TrainingError(
            f"--resume {path}: the checkpoint's steps each took {theirs} token streams "
            f"({how}), this run's take {ours} ({here}), so the data order would change: "
            f"choose BATCH_SIZE, GRAD_ACCUM_STEPS and the process count so that their "
            f"product is {theirs}")
    if list(ckpt.vocab) != vocab:
        raise TrainingError(f"--resume {path}: the checkpoint's vocabulary differs from the "
                            f"dataset's ({cfg.dataset})")
    if data is not None:
        check_data(path, ckpt.meta.get("data"), data, cfg.dataset, allow_data_change, warn)
    ignored = set().union(*OPTIMIZER_KEYS.values()) - set(relevant_keys(cfg.optimizer))
    changed = [k for k in MATH_KEYS if saved.get(k) != mine[k] and k not in ignored]
    layout = set(optimizer.state_sizes())
    if ckpt.optimizer and set(ckpt.optimizer) != layout and changed:
        raise TrainingError(
            f"--resume {path}: OPTIMIZER={cfg.optimizer} keeps other state with this run's "
            f"settings ({', '.join(sorted(layout))}) than the checkpoint holds "
            f"({', '.join(sorted(ckpt.optimizer))}), after "
            + ", ".join(f"{k} {saved.get(k)} -> {mine[k]}" for k in changed)
            + ": resume with the checkpoint's settings")
    checkpoint.validate_against(ckpt, buffer.shapes(), optimizer.state_sizes(),
                                flag="--resume")
    buffer.load_state_dict(ckpt.weights)
    optimizer.load_state_dict(ckpt.optimizer)
    if averager is not None and not averager.load_state_dict(ckpt.averages):
        warn(f"WARN: --resume {path}: the checkpoint holds no weight average (EMA_DECAY and "
             f"AVERAGE_LAST_K were off): the {averager.describe()} starts here")
    t = ckpt.meta.get("train")
    if not isinstance(t, dict) or not {"step", "epoch", "batch"} <= t.keys():
        raise CheckpointError(f"--resume {path}: the checkpoint holds no training position "
                              "(written by an older version, or damaged)")
    bad = _bad_history_field(t)
    if bad:
        raise CheckpointError(f"--resume {path}: the checkpoint's training state is damaged "
                              f"({bad} has the wrong type); resume from another checkpoint")
    if changed:
        warn("WARN: --resume with changed settings, so the run no longer continues exactly: "
             + ", ".join(f"{k} {saved.get(k)} -> {mine[k]}" for k in changed))
    return History(Position(t["step"], t["epoch"], t["batch"]), list(t.get("losses", [])),
                   list(t.get("epoch_times", [])), t.get("val_ppl"),
                   t.get("epoch_elapsed", 0.0), list(t.get("val_curve", [])),
                   t.get("best_val_ppl"), t.get("best_step"), t.get("stale_evals", 0),
                   str(t.get("run_id") or ckpt.meta.get("run_id") or new_run_id()))
