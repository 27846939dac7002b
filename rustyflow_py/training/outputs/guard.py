"""What a run may claim at its start and must admit at its end.

At the start (`claim_outputs`): its output paths are distinct, none is someone else's file or
another run's checkpoint (without --overwrite), and the checkpoint is locked against a second
run; nothing is removed. At the end: a run is "completed" only if its results are finite,
its loss scale did not collapse, every output was written where it was planned, and no stop
signal arrived while it was writing them; otherwise it says which, and the command exits
non-zero.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

from ...errors import TrainingError
from ..run.signals import Stopped
from . import writing
from .lock import RunLock
from .ownership import (
    check_distinct,
    check_replace,
    checkpoint_meta,
    clean_stale_temporaries,
    foreign,
    is_log,
    is_trace,
    ran_as,
    run_id_of,
    same_file,
)
from .saver import best_path

Say = Callable[[str], None]


@dataclasses.dataclass
class Claim:
    """What a run claimed at its start: the lock on its checkpoints (the caller's to release),
    and for each output that holds an earlier run's file the line to say when this run's
    first write replaces it (ownership.check_replace). Nothing is removed at the start: an
    earlier run's files stay as they were until this run writes something in their place."""

    lock: RunLock
    replacing: dict[str, str]


def claim_outputs(ckpt: str, log: str, trace: str | None, resume: str | None,
                  overwrite: bool, say: Say, warn: Say,
                  recipe: dict[str, Any] | None = None, device: str = "",
                  fallback: str | None = None) -> Claim:
    """Check every output path of a run before any work, lock its checkpoints and clean the
    partial writes its killed predecessors left. `recipe`: the run's configuration (an
    earlier run of the same one may be replaced), run on `device`; `fallback`: why a
    requested GPU was not used, for the message when another run's checkpoint is in the
    way."""
    recipe = ran_as(recipe, device)
    best = best_path(ckpt)
    check_distinct({"checkpoint": ckpt, "best checkpoint": best, "log file": log,
                    "trace file": trace}, locked=("checkpoint", "best checkpoint"))
    writing.check_checkpoint_target(ckpt)
    foreign(log, "log file", is_log, "set LOG_FILE to another file")
    if trace:
        foreign(trace, "trace file", is_trace, "pass --trace another file")
    lock = RunLock()
    try:
        lock.acquire(ckpt, "checkpoint", warn)
        lock.acquire(best, "best checkpoint", warn)
        run_id = _run_id(resume)
        replacing = {
            path: line for path, line in (
                (ckpt, check_replace(ckpt, "checkpoint", run_id, resume, overwrite, recipe,
                                     fallback=fallback)),
                (best, check_replace(best, "best checkpoint", run_id, resume, overwrite,
                                     recipe, heir=resume is not None
                                     and same_file(resume, ckpt), fallback=fallback)))
            if line is not None}
        for path in (ckpt, best, trace):
            if path:
                clean_stale_temporaries(path, say)
    except BaseException:
        lock.release()
        raise
    return Claim(lock, replacing)


def releases_on_failure(init: Callable[..., None]) -> Callable[..., None]:
    """For a run's __init__: if it fails after claim_outputs, its lock goes at once (not
    when the half-made run object is collected), so the lock file does not outlive it."""
    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except BaseException:
            held = getattr(self, "lock", None)
            if held is not None:
                held.release()
            raise
    return wrapper


def _run_id(resume: str | None) -> str | None:
    """The run id a resumed run continues (None for a new run, or an old checkpoint)."""
    return None if resume is None else run_id_of(checkpoint_meta(resume))


def check_loss_scale(scaler: Any, to_host: Any, step: int, precision: str) -> None:
    """TrainingError when a float16 run's loss scale has collapsed: every step is skipped, so
    the run only burns time, and its weights stop changing."""
    if scaler is None:
        return
    why = scaler.collapse(to_host)
    if why is None:
        return
    scale = float(to_host(scaler.scale))
    raise TrainingError(
        f"loss scale collapsed at step {step}: {why} (scale {scale:g}, "
        f"{int(to_host(scaler.skipped))} steps skipped in all); PRECISION={precision} cannot "
        f"represent these gradients: lower LEARNING_RATE, set GRAD_CLIP (e.g. 1.0), or train "
        f"with PRECISION=bf16 (float32's range)")


def check_results(val_ppl: float | None, test_ppl: float | None) -> None:
    """TrainingError when a final metric is not finite: such a run did not complete."""
    for name, value in (("validation", val_ppl), ("test", test_ppl)):
        if value is not None and not math.isfinite(value):
            raise TrainingError(f"the final {name} perplexity is {value}: the model's "
                                f"outputs are not finite, so the run did not complete")


def final_status(status: str, message: str | None, lost: list[str], rescued: list[str],
                 signal_during_write: int | None) -> tuple[str, str | None]:
    """The status the log block states once the final checkpoint write is over: a lost
    write, or one that went to a fallback instead of its path, fails the run; a stop signal
    that arrived during the write (which was finished) makes a completed run an interrupted
    one."""
    trouble = list(rescued)
    if lost:
        trouble.append(f"lost writes: {', '.join(lost)} could not be written anywhere")
    if trouble:
        what = "; ".join(trouble)
        return "failed", f"{message}; {what}" if message else what
    if signal_during_write is not None and status == "completed":
        name = Stopped(signal_during_write).args[0]
        note = (f"{name} arrived during the final writes; the checkpoint was finished first "
                f"and holds the final weights")
        return "interrupted", f"{message}; {note}" if message else note
    return status, message


def late_stop(requested: int | None, stop: Stopped | None) -> Stopped | None:
    """The stop to end the command with: one raised during the run, or one whose signal
    arrived while the final outputs were written (deferred until they were)."""
    if stop is not None or requested is None:
        return stop
    return Stopped(requested)
