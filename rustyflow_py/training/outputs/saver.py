"""A run's checkpoints: the resumable one and the best one, each written atomically, and each
to a fallback the warning names when its place cannot be written.

An earlier run's file at either path stays, byte for byte, until this run writes its own
there (the resumable one at its first save, the best one at its first finite validation),
and the line saying so comes then. Weights that are not finite are never written: such a
checkpoint would pass for a result."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...errors import TrainingError
from ..config.config import Config, tagged
from ..start.resume import History
from . import checkpoint, writing
from .ownership import checkpoint_meta, run_id_of


def best_path(path: str) -> str:
    """Where the best checkpoint of a run checkpointing to `path` goes: -best before .npz."""
    return tagged(path, "best")


class RunCheckpoints:
    """The checkpoints of one run. `set_aside` wraps their host copies so they do not count as
    the training step's traffic. In a data-parallel run every process calls `save` (a sharded
    optimizer gathers its state from all of them) and only the one that `writes` writes,
    after `barrier` (every process at the same step: the file is one consistent state).
    With an `averager` (model/ema.py: EMA_DECAY, AVERAGE_LAST_K) the resumable checkpoint
    also holds its state, and the best checkpoint holds the averaged weights and says so."""

    def __init__(self, path: str, cfg: Config, device: str, model: Any, optimizer: Any,
                 vocab: Any, history: History, set_aside: Callable[[], Any],
                 warn: Callable[[str], None], world_size: int = 1,
                 writes: bool = True, barrier: Callable[[], None] | None = None,
                 tokenizer: Any = None, averager: Any = None,
                 replacing: dict[str, str] | None = None,
                 data: dict[str, Any] | None = None) -> None:
        self.path, self.best = path, best_path(path)
        self.replacing = dict(replacing or {})  # guard.Claim.replacing: said when replaced
        self.data = data  # the fingerprint of the tokens trained on (data.fingerprint)
        self.averager = averager
        self.tokenizer = tokenizer  # a subword run's: written beside every checkpoint
        self.cfg, self.device, self.model, self.optimizer = cfg, device, model, optimizer
        self.vocab, self.history, self.set_aside, self.warn = vocab, history, set_aside, warn
        self.world_size, self.writes, self.barrier = world_size, writes, barrier
        self.lost: list[str] = []  # outputs no place could take: the run cannot succeed
        self.rescued: list[str] = []  # outputs written to a fallback: nor can it then
        self.written: str | None = None  # where this run last wrote its resumable checkpoint
        self.written_step = 0  # and at which step
        # the step whose weights the best file holds, when this run's history can trust it
        self.best_written: int | None = _best_on_disk(self.best, history)

    def _meta(self) -> dict[str, Any]:
        meta = {"config": self.cfg.to_dict(), "device": self.device,
                "world_size": self.world_size, "train": self.history.to_meta()}
        if self.data is not None:
            meta["data"] = self.data
        if self.tokenizer is not None:
            meta["tokenizer"] = self.tokenizer.meta()
        return meta

    def _write(self, path: str, weights: dict[str, Any], meta: dict[str, Any],
               state: dict[str, Any] | None = None,
               averages: dict[str, Any] | None = None) -> Any:
        """The checkpoint at `path`, after the tokenizer it names (when it has one)."""
        if self.tokenizer is not None:
            self.tokenizer.save_beside(path)
        return checkpoint.save(path, weights, meta, self.vocab, state, averages)

    def save(self) -> str | None:
        """Weights, optimizer state, history, config and vocabulary: everything `--resume`
        needs. Returns where it went (None if nowhere could take it)."""
        meta = self._meta()
        with self.set_aside():
            state = self.optimizer.state_dict()
            if self.barrier is not None:
                self.barrier()
            if not self.writes:
                return None
            weights = self.model.buffer.state_dict()
            averages = self.averager.state_dict() if self.averager is not None else None
            self._check_finite(weights, "checkpoint")
            written = writing.write_with_fallback(
                self.path, lambda p: self._write(p, weights, meta, state, averages),
                "checkpoint", self.warn)
        self._account(self.path, written, f"checkpoint (step {self.history.pos.step})")
        if written.place is not None:
            self.path = self.written = written.place
            self.written_step = self.history.pos.step
        return written.place

    def on_disk(self) -> str:
        """What stopping now, without another save, leaves on disk (in words)."""
        best = (f"its best checkpoint {self.best} holds step {self.best_written}; "
                if self.best_written is not None else "")
        if self.written is not None:
            return (f"{best}{self.written} holds this run's step {self.written_step} "
                    f"(--resume {self.written} continues from there)")
        if Path(self.path).is_file():
            return (f"{best}this run wrote no checkpoint, and {self.path} is as it was "
                    f"before")
        return f"{best}this run wrote no checkpoint"

    def save_best(self) -> None:
        """The best weights so far (no optimizer state: this file is for evaluation and
        generation; --resume takes the regular checkpoint). With an averager the caller has
        the averaged weights swapped in (Trainer._validate), and the meta says so."""
        if not self.writes:
            return
        meta = self._meta()
        if self.averager is not None:
            meta["averaged"] = self.averager.describe()
        with self.set_aside():
            weights = self.model.buffer.state_dict()
            self._check_finite(weights, "best checkpoint")
            written = writing.write_with_fallback(
                self.best, lambda p: self._write(p, weights, meta),
                "best checkpoint", self.warn)
        self._account(self.best, written, f"best checkpoint (step {self.history.best_step})")
        if written.place is not None:
            self.best, self.best_written = written.place, self.history.best_step
        else:
            self.best_written = None  # the file on disk is an older best: never load it

    def _check_finite(self, weights: dict[str, Any], what: str) -> None:
        """TrainingError when a weight is nan or inf: nothing is written, the files already
        on disk stay."""
        bad = checkpoint.nonfinite(weights)
        if bad is not None:
            name, count = bad
            raise TrainingError(
                f"the weights at step {self.history.pos.step} are not finite ({name} holds "
                f"{count:,} nan/inf of {weights[name].size:,} values): the {what} is not "
                f"written, and the files already at {self.path} stay as they were")

    def _account(self, planned: str, written: writing.Written, what: str) -> None:
        """After a write meant for `planned`: say what it replaced of an earlier run (only
        once that is so), or count it lost or rescued (the run then ends failed)."""
        if written.place == planned:
            line = self.replacing.pop(planned, None)
            if line is not None:
                self.warn(line)
        elif written.rescued is not None:
            self.rescued.append(f"the {what} {written.rescued}")
        else:
            self.lost.append(what)

    @property
    def best_file(self) -> str | None:
        """The best checkpoint, if it holds the best validated weights (else None)."""
        step = self.history.best_step
        return self.best if step is not None and self.best_written == step else None

    @contextlib.contextmanager
    def best_weights(self, now: int) -> Iterator[str]:
        """Inside, the model holds the best validated weights (unless the last ones are the
        best, or none were saved); yields which weights those are. The last weights are put
        back afterwards, so the final checkpoint stays resumable. With an averager, the
        weights are the averaged ones (the best file holds those)."""
        h = self.history
        of = f", {self.averager.describe()}" if self.averager is not None else ""
        if h.best_step == now or self.best_file is None:
            with self.averaged():
                yield f"final (step {now}){of}"
            return
        buffer = self.model.buffer
        with self.set_aside():
            last = buffer.state_dict()
            buffer.load_state_dict(checkpoint.Checkpoint(self.best).weights)
        try:
            yield f"best (step {h.best_step}){of}"
        finally:
            with self.set_aside():
                buffer.load_state_dict(last)

    def averaged(self) -> contextlib.AbstractContextManager[None]:
        """Inside, the model holds the averaged weights (the raw ones without an averager)."""
        if self.averager is None:
            return contextlib.nullcontext()
        return self.averager.swapped_in()


def _best_on_disk(path: str, history: History) -> int | None:
    """The best step a resumed run's best file holds, when it is that run's (else None)."""
    meta = checkpoint_meta(path) if Path(path).is_file() else None
    if meta is None or run_id_of(meta) != history.run_id:
        return None
    return history.best_step if meta["train"].get("step") == history.best_step else None
