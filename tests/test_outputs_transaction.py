"""A run's outputs are a transaction, tried as a random sequence of runs in one folder.

Runs of two configurations share one checkpoint path: the same command again, the other
configuration (refused, or told to --overwrite), resumes, and runs that fail or are stopped
at every stage (unreadable data, a full disk, non-finite weights, nan validations, Ctrl-C
inside a step, Ctrl-C twice inside a write). After every command:
- no file of an earlier run is gone, and the log only grew, by whole blocks;
- every file that changed was written by this command's own run (its run id: a new one, or
  the one it resumed), holds finite weights, and reads as a checkpoint;
- a command that stopped before its first save changed nothing at all.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import (
    TINY,
    Patch,
    combine,
    disk_full,
    env_file,
    invoke,
    log_records,
    nan_in_saved_weights,
    nan_validation,
    no_fallbacks,
)

from rustyflow_py.training.outputs import checkpoint
from rustyflow_py.training.outputs.checkpoint import Checkpoint
from rustyflow_py.training.outputs.ownership import checkpoint_meta, run_id_of
from rustyflow_py.training.run.step import StepRunner

CKPT, BEST = "models/tiny-cpu.npz", "models/tiny-cpu-best.npz"


def ctrl_c_in_step(step: int, twice: bool = False) -> Patch:
    """Ctrl-C inside the command's `step`-th step; with `twice`, again as the checkpoint
    write begins."""
    def patch(mp: pytest.MonkeyPatch) -> None:
        real_run, real_save = StepRunner.run, checkpoint.save
        steps = 0

        def run(self: StepRunner, done: int) -> None:
            nonlocal steps
            steps += 1
            if steps == step:
                os.kill(os.getpid(), signal.SIGINT)
            real_run(self, done)

        def save(*args: Any, **kwargs: Any) -> Path:
            os.kill(os.getpid(), signal.SIGINT)
            return real_save(*args, **kwargs)
        mp.setattr(StepRunner, "run", run)
        if twice:
            mp.setattr(checkpoint, "save", save)
    return patch


def unreadable_data(mp: pytest.MonkeyPatch) -> None:
    from rustyflow_py.errors import DataError
    from rustyflow_py.training.subword import corpus

    def load(*_: Any, **__: Any) -> None:
        raise DataError("tiny.txt cannot be read (injected)")
    mp.setattr(corpus, "load_corpus", load)


# name -> (extra arguments, fault, whether it may write); a resume gets --resume, --max-steps
OPS: dict[str, tuple[tuple[str, ...], Patch | None, bool]] = {
    "same": ((), None, True),
    "same-longer": (("--max-steps", "5"), None, True),
    "other": (("--config", "b.env"), None, True),
    "other-overwrite": (("--config", "b.env", "--overwrite"), None, True),
    "resume": (("resume",), None, True),
    "ctrl-c": (("--max-steps", "5"), ctrl_c_in_step(2), True),
    "unreadable-data": ((), unreadable_data, False),
    "overwrite-unreadable-data": (("--config", "b.env", "--overwrite"), unreadable_data,
                                  False),
    "disk-full": ((), combine(disk_full(), no_fallbacks), False),
    "nan-weights": ((), nan_in_saved_weights(np.inf), False),
    "nan-validation": ((), nan_validation, False),
    "ctrl-c-twice": (("--max-steps", "5"), ctrl_c_in_step(2, twice=True), False),
    "resume-ctrl-c-twice": (("resume",), ctrl_c_in_step(1, twice=True), False),
}


def checkpoints() -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(Path("models").glob("*.npz"))}


def log_bytes() -> bytes:
    return Path("log.txt").read_bytes() if Path("log.txt").exists() else b""


def command(op: str) -> list[str] | None:
    """The command line of `op` now (None: a resume with no checkpoint to resume)."""
    extra = list(OPS[op][0])
    if extra[:1] != ["resume"]:
        config = [] if "--config" in extra else ["--config", "a.env"]
        return ["train", *config, "--max-steps", "3", *extra]
    if not Path(CKPT).is_file():
        return None
    ckpt = Checkpoint(CKPT)
    config = "a.env" if ckpt.config["LEARNING_RATE"] == TINY["LEARNING_RATE"] else "b.env"
    step = ckpt.meta["train"]["step"]
    return ["train", "--config", config, "--resume", CKPT, "--max-steps", str(step + 2)]


def check_step(op: str, args: list[str], before: dict[str, bytes], log_before: bytes,
               out: str) -> None:
    """The invariants of the module docstring, after `args` ran on the files `before`."""
    after, log_after = checkpoints(), log_bytes()
    assert log_after.startswith(log_before), f"{op}: the log was rewritten"
    log_records()  # every block whole: the parser warns of a torn one
    owners = {name: run_id_of(checkpoint_meta(name)) for name in after}
    was = {name: run_id_of(_meta(data)) for name, data in before.items()}
    for name in before:
        assert name in after, f"{op}: {name} of an earlier run is gone:\n{out}"
    changed = [name for name in after if before.get(name) != after[name]]
    if not OPS[op][2]:
        assert not changed, f"{op} changed {changed}:\n{out}"
    resumed = was.get(CKPT) if "--resume" in args else None
    writers = {owners[name] for name in changed}
    assert len(writers) <= 1, f"{op}: {changed} were written by several runs"
    for name in changed:
        Checkpoint(name)  # whole, with finite weights (else this raises)
        assert owners[name] == resumed or owners[name] not in was.values(), (
            f"{op} changed {name}, which its run did not write:\n{out}")
        if name in before and was[name] != owners[name]:
            what = "best checkpoint" if name == BEST else "checkpoint"
            assert f"replaced the {what} {name}" in out, f"{op}: replaced silently:\n{out}"


def _meta(data: bytes) -> dict[str, Any] | None:
    """The meta of a checkpoint held as bytes (written to a scratch file and read back)."""
    scratch = Path("models/.scratch-meta.npz")
    scratch.write_bytes(data)
    try:
        return checkpoint_meta(scratch)
    finally:
        scratch.unlink()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_earlier_file_is_lost_in_any_sequence_of_runs(tiny_dir: Path, seed: int) -> None:
    """Every operation once, in a random order, then a few more at random."""
    (tiny_dir / "a.env").write_text(env_file(TINY))
    (tiny_dir / "b.env").write_text(env_file({**TINY, "LEARNING_RATE": 2e-2}))
    rng = random.Random(seed)
    ops = sorted(OPS)
    rng.shuffle(ops)
    ran: list[str] = []
    for op in ["same", *ops, *rng.choices(sorted(OPS), k=6)]:
        args = command(op)
        if args is None:
            continue
        before, log_before = checkpoints(), log_bytes()
        fault = OPS[op][1]
        with pytest.MonkeyPatch.context() as mp:
            if fault is not None:
                fault(mp)
            result = invoke(*args)
        assert "Traceback" not in result.output, result.output
        assert result.exit_code in (0, 1, 130), (op, result.output)
        check_step(op, args, before, log_before, result.output)
        ran.append(op)
    assert set(ran) >= set(OPS) - {"resume", "resume-ctrl-c-twice"}


def test_a_resumed_run_replaces_the_best_file_its_checkpoint_sat_beside(
        workspace: Path) -> None:
    """--overwrite by another configuration, stopped before its first validation: its
    checkpoint replaced the earlier run's, whose best file stays. Resuming it is not refused
    for that best file: the resumed run replaces it at its first validation, saying so."""
    other = ("--learning-rate", "0.02")
    with pytest.MonkeyPatch.context() as mp:
        ctrl_c_in_step(1)(mp)
        stopped = invoke("train", "--config", "tiny.env", *other, "--overwrite",
                         "--max-steps", "5")
    assert stopped.exit_code == 130, stopped.output
    earlier_best = run_id_of(checkpoint_meta(BEST))
    assert run_id_of(checkpoint_meta(CKPT)) != earlier_best
    resumed = invoke("train", "--config", "tiny.env", *other, "--resume", CKPT,
                     "--max-steps", "3")
    assert resumed.exit_code == 0, resumed.output
    assert (f"INFO: replaced the best checkpoint {BEST} (trained 3 steps), which the run this "
            f"one resumes had not replaced yet") in resumed.output
    assert run_id_of(checkpoint_meta(BEST)) == run_id_of(checkpoint_meta(CKPT))
