"""The fault matrix: each case is a fault a hostile user or a busy machine causes, the message
and exit status the command must answer with, and what must be intact afterwards.

Every case starts from the same folder: a trained tiny model (its checkpoint, best checkpoint
and log), a text file and another program's .npz. After the command, every file that was
there before has the same bytes, except the ones the case says the command may rewrite (and
the log, which may only grow: its old bytes must be its start). The matrix runs the commands
in this process (CliRunner), except where a real signal must reach a real `rustyflow train`:
those run as subprocesses that pause at the dangerous moment (see training/run/hooks.py), so the
signal lands there without relying on sleeps.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    TRAIN,
    TRAINED,
    Lines,
    Patch,
    assert_intact,
    combine,
    disk_full,
    invoke,
    log_records,
    nan_in_saved_weights,
    nan_validation,
    no_fallbacks,
    poison_weights_after,
    snapshot,
    subprocess_env,
)

from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.precision import Precision
from rustyflow_py.reporting import logfile
from rustyflow_py.training.evaluation import evaluate
from rustyflow_py.training.outputs import checkpoint, lock
from rustyflow_py.training.outputs.checkpoint import Checkpoint
from rustyflow_py.training.run import parts as run_parts

pytestmark = pytest.mark.usefixtures("tiny_dir")

NEW = ("--model-path", "models/new-cpu.npz")  # a path no earlier run used, used as typed
PAUSED_CLI = Path(__file__).with_name("paused_cli.py")  # a run with pause points injected


# ------------------------------------------------------------------------------ the harness


@dataclass(frozen=True)
class Case:
    """One fault: what goes wrong, the command, the answer, what may change."""

    name: str
    fault: str
    args: tuple[str, ...]
    exit_code: int
    message: str  # a regex the command's output must match
    replaced: tuple[str, ...] = ()  # pre-existing files the command may rewrite
    setup: Callable[[Path], None] | None = None
    patch: Patch | None = None
    check: Callable[[Path], None] | None = None  # what else must hold afterwards
    never: str | None = None  # a regex the output must not match


def run_case(case: Case, root: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if case.setup:
        case.setup(root)
    before = snapshot(root)
    if case.patch:
        case.patch(monkeypatch)
    result = invoke(*case.args)
    out = result.output
    assert result.exit_code == case.exit_code, out
    assert result.exception is None or isinstance(result.exception, SystemExit), out
    assert "Traceback" not in out
    assert re.search(case.message, out), f"{case.message!r} not in:\n{out}"
    assert case.never is None or not re.search(case.never, out), out
    assert not re.search(r"\s(to|from|at|in|file|checkpoint)\s+[:;,]", out), (
        f"an empty path in:\n{out}")
    assert_intact(before, snapshot(root), case.replaced)
    if case.check:
        case.check(root)
    return out


# ------------------------------------------------------------------------------ setups and checks


def text_at(path: str) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("not rustyflow's\n")
    return setup


def their_npz_at(path: str) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        with open(root / path, "wb") as f:
            np.savez(f, weights=np.ones(3))
    return setup


def another_run_at(path: str) -> Callable[[Path], None]:
    def setup(_root: Path) -> None:
        assert invoke(*TRAIN, "--model-path", path, "--max-steps", "2").exit_code == 0
    return setup


def data_unreadable(root: Path) -> None:
    """The dataset is found, but is no text: the run fails after claiming its outputs."""
    (root / "tiny.txt").write_bytes(b"\xff\xfe not UTF-8\n")


def lines_swapped(root: Path) -> None:
    """Two lines of the training text swapped: the same words, another token stream."""
    lines = (root / "tiny.txt").read_text().splitlines(keepends=True)
    lines[100], lines[101] = lines[101], lines[100]
    (root / "tiny.txt").write_text("".join(lines))


def quoting_a_block(path: str) -> Callable[[Path], None]:
    """A user's text that quotes a log block's header (a copy of the README, say)."""
    def setup(root: Path) -> None:
        (root / path).write_text("# Notes\n\n```\n=== RustyFlow run 2026 | completed\n```\n")
    return setup


def quoting_the_trace_mark(root: Path) -> None:
    (root / "trace.json").write_text('{"notes": "a trace says"}\n"producer":"rustyflow train '
                                     '--trace"\n')


def a_sweep(root: Path) -> None:
    """A bench.json of a sweep with no rows (what `bench --from-json` reads)."""
    (root / "sweep.json").write_text(json.dumps({
        "vocab": 9, "seconds": 1.0, "rows": [], "devices": {
            "cpu": {"describe": "a CPU"}, "gpu": {"usable": False, "reason": "none here"}}}))


def stale_lock(_root: Path) -> None:
    Path("models/tiny-cpu.npz.lock").write_text(
        f"{lock.MARK}\npid=4194999\nsince=2026-01-01T00:00:00Z\nhost=gone\n")


def big_checkpoint(root: Path) -> None:
    """A small checkpoint whose stored config describes a 2.5-trillion-parameter model (10 TB in
    float32: larger than any machine's memory, so the refusal does not depend on the host)."""
    ckpt = Checkpoint(root / TRAINED[0])
    config = {**ckpt.meta["config"], "NUM_LAYERS": 48, "EMBED_DIM": 65536, "NUM_HEADS": 8}
    checkpoint.save(root / "models/big.npz", ckpt.weights, {**ckpt.meta, "config": config},
                    ckpt.vocab, ckpt.optimizer)


def last_record(status: str, message: str) -> Callable[[Path], None]:
    def check(_root: Path) -> None:
        record = log_records()[-1]
        assert record["status"] == status, record["status"]
        assert re.search(message, record["message"] or ""), record["message"]
    return check


def blocks_whole(count: int) -> Callable[[Path], None]:
    """log.txt holds `count` blocks, each whole (the parser warns of any torn one)."""
    def check(_root: Path) -> None:
        assert len(log_records()) == count
    return check


def absent(*paths: str) -> Callable[[Path], None]:
    def check(root: Path) -> None:
        for p in paths:
            assert not (root / p).exists(), f"{p} exists"
    return check


def checkpoint_at(path: str, step: int) -> Callable[[Path], None]:
    def check(root: Path) -> None:
        assert Checkpoint(root / path).meta["train"]["step"] == step
    return check


def both(*checks: Callable[[Path], None]) -> Callable[[Path], None]:
    def check(root: Path) -> None:
        for c in checks:
            c(root)
    return check


# ------------------------------------------------------------------------------ patches


def log_full(mp: pytest.MonkeyPatch) -> None:
    def append(path: str, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")
    mp.setattr(logfile, "append_block", append)


def no_locks(mp: pytest.MonkeyPatch) -> None:
    def flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")
    mp.setattr(lock.fcntl, "flock", flock)


def torn_log_write(mp: pytest.MonkeyPatch) -> None:
    """The disk fills part-way through the log block: half of it is written, then ENOSPC."""
    real = os.write

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/log.txt"):
            real(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)
    mp.setattr(logfile.os, "write", write)


def fp16_overflow_storm(mp: pytest.MonkeyPatch) -> None:
    """Loss scaling on the CPU (fp32 with float16's dynamic scale), and weights that overflow
    after the second update: from then on every step's gradients are non-finite."""
    mp.setattr(Precision, "loss_scaling", property(lambda self: True))
    poison_weights_after(mp, 2)


def never_built(mp: pytest.MonkeyPatch) -> None:
    """Building a model fails the test: a refusal must come before any allocation."""
    def build(*_: object, **__: object) -> None:
        raise AssertionError("the model was built before the size check refused it")
    mp.setattr(run_parts, "build_model", build)
    mp.setattr(evaluate, "build_model", build)


HUGE = ("--num-layers", "48", "--embed-dim", "8192", "--num-heads", "8")

CASES = [
    # -- never write over what rustyflow did not make, or over a different run's work
    Case("trace-is-the-log", "--trace names the run's own log file",
         (*TRAIN, *NEW, "--profile", "--trace", "log.txt"), 1,
         r"the trace file and the log file are both log.txt"),
    Case("trace-is-the-checkpoint", "--trace names the run's checkpoint",
         (*TRAIN, "--profile", "--trace", TRAINED[0]), 1,
         r"the trace file and the checkpoint are both models/tiny-cpu.npz"),
    Case("trace-over-a-text-file", "--trace names someone's file",
         (*TRAIN, *NEW, "--profile", "--trace", "notes.txt"), 1,
         r"trace file notes.txt exists and was not written by rustyflow"),
    Case("model-path-is-a-text-file", "MODEL_PATH names a text file",
         (*TRAIN, "--model-path", "notes-cpu.npz"), 1,
         r"checkpoint notes-cpu.npz exists and is not a rustyflow checkpoint",
         setup=text_at("notes-cpu.npz")),
    Case("model-path-is-their-npz", "MODEL_PATH names another program's .npz",
         (*TRAIN, "--model-path", "models/their-cpu.npz"), 1,
         r"checkpoint models/their-cpu.npz exists and is not a rustyflow checkpoint",
         setup=their_npz_at("models/their-cpu.npz")),
    Case("best-path-is-theirs", "the -best file beside MODEL_PATH is someone's",
         (*TRAIN, *NEW), 1,
         r"best checkpoint models/new-cpu-best.npz exists and is not a rustyflow checkpoint",
         setup=text_at("models/new-cpu-best.npz")),
    Case("log-file-is-a-text-file", "LOG_FILE names a text file",
         (*TRAIN, *NEW, "--log-file", "notes.txt"), 1,
         r"log file notes.txt exists and was not written by rustyflow"),
    Case("lock-file-is-theirs", "the checkpoint's lock path holds someone's file",
         (*TRAIN, *NEW), 1,
         r"models/new-cpu.npz.lock exists and was not written by rustyflow",
         setup=text_at("models/new-cpu.npz.lock")),
    Case("short-try-run", "a 2-step try run at the path of a trained model",
         (*TRAIN, "--max-steps", "2"), 1,
         r"checkpoint models/tiny-cpu.npz holds another run's model \(trained 3 steps\), "
         r"which this run would replace: resume it with --resume models/tiny-cpu.npz, set "
         r"--model-path to a new file, or pass --overwrite"),
    Case("same-command-again", "the command that trained the model, run again",
         (*TRAIN, "--max-steps", "3"), 0,
         r"replaced the checkpoint models/tiny-cpu.npz of an earlier run of the same "
         r"configuration", replaced=TRAINED, check=checkpoint_at(TRAINED[0], 3)),
    Case("told-to-overwrite", "--overwrite replaces another run's checkpoint",
         (*TRAIN, "--max-steps", "2", "--overwrite"), 0,
         r"--overwrite: replaced the checkpoint models/tiny-cpu.npz of another run",
         replaced=TRAINED, check=checkpoint_at(TRAINED[0], 2)),
    Case("resume-replaces-its-own", "--resume writes over its own checkpoint",
         (*TRAIN, "--resume", TRAINED[0], "--max-steps", "5"), 0,
         r"Resumed from models/tiny-cpu.npz at step 3", replaced=TRAINED,
         check=checkpoint_at(TRAINED[0], 5)),
    Case("resume-into-another-run", "--resume writing to a different run's checkpoint",
         (*TRAIN, "--resume", TRAINED[0], "--model-path", "models/other-cpu.npz",
          "--max-steps", "5"), 1,
         r"checkpoint models/other-cpu.npz holds another run's model",
         setup=another_run_at("models/other-cpu.npz")),
    Case("fallback-never-overwrites", "the checkpoint folder is full, and the fallback "
         "folder holds files of the checkpoint's name",
         (*TRAIN, *NEW), 1, r"wrote it to \S+/new-cpu-rescued1.npz instead: the run will end "
         r"failed",
         setup=both(text_at("new-cpu.npz"), text_at("new-cpu-best.npz")),
         patch=disk_full("models/"),
         check=both(checkpoint_at("new-cpu-rescued1.npz", 29),
                    last_record("failed", r"the checkpoint \(step 29\) went to "
                                          r"\S+/new-cpu-rescued1.npz instead of "
                                          r"models/new-cpu.npz \(No space left"))),
    Case("bench-out-holds-their-report", "`bench --out` names a folder with someone's "
         "bench.md", ("bench", "--from-json", "sweep.json", "--out", "results"), 1,
         r"bench report results/bench.md exists and was not written by rustyflow",
         setup=both(a_sweep, text_at("results/bench.md"))),
    Case("bench-out-rewrites-its-own", "`bench --out` again over its own results",
         ("bench", "--from-json", "sweep.json", "--out", "results"), 0, r"wrote results/bench.md",
         replaced=("results/bench.md", "results/bench.json"),
         setup=both(a_sweep, lambda _: invoke("bench", "--from-json", "sweep.json", "--out",
                                              "results"))),
    Case("plot-out-holds-their-picture", "`plot --out` names a folder with someone's PNG",
         ("plot", "--log", "log.txt", "--format", "png"), 1,
         r"plots/loss-curves.png exists and was not drawn by rustyflow",
         setup=text_at("plots/loss-curves.png")),
    # -- a run's outputs are a transaction: nothing of an earlier run goes before it is replaced
    Case("failed-start-keeps-earlier-files", "the same configuration run again, and its "
         "data cannot be read", (*TRAIN, "--max-steps", "3"), 1,
         r"tiny.txt is not UTF-8 text", setup=data_unreadable, never="replac"),
    Case("overwrite-failed-start", "--overwrite, and the data cannot be read",
         (*TRAIN, "--max-steps", "2", "--overwrite"), 1, r"tiny.txt is not UTF-8 text",
         setup=data_unreadable, never="replac"),
    Case("nan-weights-never-saved", "the same configuration again, and the weights turn "
         "non-finite while the loss does not", (*TRAIN, "--max-steps", "3"), 1,
         r"the weights at step 3 are not finite \(wte holds 1 nan/inf of 288 values\): the "
         r"best checkpoint is not written, and the files already at models/tiny-cpu.npz stay",
         patch=nan_in_saved_weights(), never="replaced",
         check=last_record("failed", "are not finite")),
    Case("resume-on-changed-data", "--resume after two lines of the training text were "
         "swapped (same vocabulary)", (*TRAIN, "--resume", TRAINED[0], "--max-steps", "5"), 1,
         r"--resume models/tiny-cpu.npz: the training data changed: the checkpoint trained on "
         r"1,890 tokens, sha256 [0-9a-f]{16}, tiny.txt's training split is now 1,890 tokens, "
         r"sha256 [0-9a-f]{16}; resume with the data it trained on, or pass "
         r"--allow-data-change", setup=lines_swapped),
    Case("resume-on-changed-data-allowed", "--resume on changed data, accepted",
         (*TRAIN, "--resume", TRAINED[0], "--max-steps", "5", "--allow-data-change"), 0,
         r"WARN: --allow-data-change: the checkpoint trained on 1,890 tokens",
         setup=lines_swapped, replaced=TRAINED, check=checkpoint_at(TRAINED[0], 5)),
    Case("log-file-quotes-a-block", "LOG_FILE names a text that quotes a log block's header",
         (*TRAIN, *NEW, "--log-file", "readme.md"), 1,
         r"log file readme.md exists and was not written by rustyflow",
         setup=quoting_a_block("readme.md")),
    Case("trace-quotes-the-mark", "--trace names a file that quotes a trace's mark",
         (*TRAIN, *NEW, "--profile", "--trace", "trace.json"), 1,
         r"trace file trace.json exists and was not written by rustyflow",
         setup=quoting_the_trace_mark),
    Case("torn-log-block", "the disk fills half-way through the log block",
         (*TRAIN, *NEW, "--max-steps", "3"), 1,
         r"Error: the log block went to \S+training_log.txt instead of log.txt \(No space "
         r"left on device\)", patch=torn_log_write, check=blocks_whole(1)),
    Case("log-is-the-lock", "LOG_FILE names the checkpoint's lock file",
         (*TRAIN, *NEW, "--log-file", "models/new-cpu.npz.lock"), 1,
         r"the checkpoint's lock file and the log file are both models/new-cpu.npz.lock"),
    Case("trace-is-the-best-lock", "--trace names the best checkpoint's lock file",
         (*TRAIN, *NEW, "--profile", "--trace", "models/new-cpu-best.npz.lock"), 1,
         r"the best checkpoint's lock file and the trace file are both "
         r"models/new-cpu-best.npz.lock"),
    # -- run lock
    Case("stale-lock", "a lock file left by a killed run",
         (*TRAIN, "--resume", TRAINED[0], "--max-steps", "5"), 0,
         r"took over the lock on the checkpoint left by pid 4194999 since "
         r"2026-01-01T00:00:00Z \(host gone\), which is no longer running",
         replaced=(*TRAINED, "models/tiny-cpu.npz.lock"), setup=stale_lock,
         check=absent("models/tiny-cpu.npz.lock")),
    Case("no-file-locks", "a file system without locks", (*TRAIN, *NEW), 0,
         r"has no file locks \(No locks available\): the checkpoint is not protected",
         patch=no_locks),
    # -- nothing reported that did not happen
    Case("nan-validation", "every validation is nan", (*TRAIN, *NEW, "--max-steps", "3"), 1,
         r"the final validation perplexity is nan", patch=nan_validation,
         check=both(absent("models/new-cpu-best.npz", "models/new-cpu.npz"),
                    last_record("failed", "validation perplexity is nan"))),
    Case("learning-rate-overflows", "a learning rate so large that the validation loss "
         "overflows exp()", (*TRAIN, *NEW, "--learning-rate", "33", "--max-steps", "2"), 1,
         r"Error: the final validation perplexity is inf: the model's outputs are not finite",
         check=both(absent("models/new-cpu-best.npz", "models/new-cpu.npz"),
                    last_record("failed", "validation perplexity is inf"))),
    Case("loss-scale-collapse", "an overflow storm: every step's gradients overflow",
         (*TRAIN, *NEW, "--num-epochs", "2"), 1,
         r"loss scale collapsed at step 29: the loss scale fell below 0.000977 \(scale "
         r"0.000488281, 27 steps skipped in all\).*lower LEARNING_RATE",
         patch=fp16_overflow_storm,
         check=both(absent("models/new-cpu-best.npz"),
                    last_record("failed", "loss scale collapsed"))),
    Case("disk-full-for-checkpoints", "no place takes a checkpoint",
         (*TRAIN, *NEW, "--max-steps", "3"), 1,
         r"could not write the checkpoint to models/new-cpu.npz \(No space left on device\), "
         r"nor to \S+new-cpu\S*.npz or \S+new-cpu\S*.npz: it is lost", patch=disk_full(),
         check=last_record("failed", r"lost writes: best checkpoint \(step 3\), checkpoint "
                                     r"\(step 3\) could not be written anywhere")),
    Case("disk-full-everywhere", "no place takes a checkpoint or the log block",
         (*TRAIN, *NEW, "--max-steps", "3"), 1,
         r"Error: the log block of this failed run is lost",
         patch=combine(disk_full(), log_full)),
    Case("nowhere-to-fall-back", "the write fails and there is no other place",
         (*TRAIN, *NEW, "--max-steps", "3"), 1,
         r"could not write the checkpoint to models/new-cpu.npz \(No space left on device\): "
         r"it is lost", patch=combine(disk_full(), no_fallbacks)),
    # -- size before build
    Case("huge-model-cpu", "a 38-billion-parameter model on a small machine",
         (*TRAIN, *NEW, *HUGE), 1,
         r"the model does not fit: training L48 E8192 \(vocabulary \d+\), [\d,.]+ M "
         r"parameters needs about [\d.]+ GiB of host memory \(parameters [\d.]+ GiB, "
         r"gradients .*\), but [\d.]+ GiB is available: reduce EMBED_DIM or NUM_LAYERS",
         patch=never_built),
    Case("eval-huge-stored-config", "eval of a checkpoint whose config is huge",
         ("eval", "--model", "models/big.npz", "--device", "cpu"), 1,
         r"the model does not fit: evaluation L48 E65536", setup=big_checkpoint,
         patch=never_built),
    Case("generate-huge-stored-config", "generate from a checkpoint whose config is huge",
         ("generate", "--model", "models/big.npz", "--device", "cpu", "--prompt", "the"), 1,
         r"the model does not fit: evaluation L48 E65536", setup=big_checkpoint,
         patch=never_built),
    Case("resume-huge-stored-config", "--resume of a checkpoint whose config is huge",
         (*TRAIN, "--resume", "models/big.npz", "--model-path", "models/big.npz", *HUGE), 1,
         r"the model does not fit: training L48 E8192", setup=big_checkpoint,
         patch=never_built),
    Case("enormous-log-interval", "LOG_INTERVAL larger than any array",
         (*TRAIN, *NEW, "--max-steps", "3", "--log-interval", "9" * 30), 0,
         r"Checkpoint: models/new-cpu.npz"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fault(case: Case, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_case(case, workspace, monkeypatch)


# ------------------------------------------------------------------------------ real signals


@contextmanager
def paused(root: Path, point: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`rustyflow train args` in a subprocess, held at the pause point `point` (see
    training/run/hooks.py, injected by paused_cli.py) until the block ends; killed if it outlives
    the test."""
    marker = root / "pause.marker"
    env = subprocess_env(PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(PAUSED_CLI), point, str(marker), *TRAIN, *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, f"{point} was never reached"
            time.sleep(0.01)
        yield proc
    finally:
        marker.unlink(missing_ok=True)
        if proc.poll() is None:
            try:
                proc.wait(timeout=120)
            finally:
                proc.kill()


@dataclass(frozen=True)
class SignalCase:
    name: str
    fault: str
    point: str  # where the signal lands
    args: tuple[str, ...]
    exit_code: int
    status: str  # of the log block
    message: str  # regex over the block's message
    step: int  # of the checkpoint left behind


SIGNAL_CASES = [
    SignalCase("sigterm-in-the-final-write", "SIGTERM between the final checkpoint's fsync "
               "and its rename (rename 1: the best file, 2: the final checkpoint)",
               "checkpoint-rename:2", ("--max-steps", "3"), 143, "interrupted",
               r"SIGTERM arrived during the final writes; the checkpoint was finished first",
               3),
    SignalCase("sigterm-in-the-best-write", "SIGTERM inside the best checkpoint's rename "
               "(rename 1, at the final validation)", "checkpoint-rename:1",
               ("--max-steps", "3"), 143, "interrupted",
               r"SIGTERM arrived during the final writes; the checkpoint was finished first",
               3),
    SignalCase("sigterm-in-evaluation", "SIGTERM during the final validation",
               "evaluation:1", ("--max-steps", "3"), 143, "interrupted",
               r"interrupted at step 3", 3),
    SignalCase("sigterm-in-an-epoch-end-rename", "SIGTERM inside the epoch-end checkpoint's "
               "rename (rename 1: epoch 1's best file, 2: its checkpoint)",
               "checkpoint-rename:2", ("--num-epochs", "2"), 143, "interrupted",
               r"interrupted at step 29", 29),
]


@pytest.mark.parametrize("case", SIGNAL_CASES, ids=lambda c: c.name)
def test_signal_at_a_dangerous_moment(case: SignalCase, workspace: Path) -> None:
    before = snapshot(workspace)
    with paused(workspace, case.point, *NEW, *case.args) as proc:
        proc.send_signal(signal.SIGTERM)
    out = proc.communicate()[0]
    assert proc.returncode == case.exit_code, out
    assert "Traceback" not in out
    record = log_records()[-1]
    assert record["status"] == case.status
    assert re.search(case.message, record["message"]), record["message"]
    assert Checkpoint("models/new-cpu.npz").meta["train"]["step"] == case.step
    if record["best_checkpoint"]:  # the best file a block names holds that validation
        best = Checkpoint(record["best_checkpoint"]).meta["train"]["step"]
        assert best == record["best_step"]
    assert not list(Path("models").glob(".*.tmp")), "a temporary was left behind"
    assert_intact(before, snapshot(workspace))


def test_sigterm_while_the_log_block_is_written(workspace: Path) -> None:
    """SIGTERM while a run that has completed appends its log block: the block is written
    whole (as the completed run it is), the console says the signal came then, and the
    command exits 143."""
    before = snapshot(workspace)
    with paused(workspace, "log-append:1", *NEW, "--max-steps", "3") as proc:
        proc.send_signal(signal.SIGTERM)
    out = proc.communicate()[0]
    assert proc.returncode == 143, out
    assert "Traceback" not in out
    assert "A stop request arrived while the log block was written: the run had ended " \
           "completed (as logged)" in out
    record = log_records()[-1]
    assert record["status"] == "completed" and record["steps"] == 3
    assert_intact(before, snapshot(workspace))


def test_a_first_ctrl_c_saves_and_names_the_resume_command(workspace: Path) -> None:
    """Ctrl-C during evaluation: the run saves its checkpoint, writes an `interrupted` block,
    exits 130, and prints the command that continues it."""
    before = snapshot(workspace)
    with paused(workspace, "evaluation:1", *NEW, "--max-steps", "3", "--overwrite") as proc:
        proc.send_signal(signal.SIGINT)
    out = proc.communicate()[0]
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    assert re.search(r"To continue: (rustyflow|\./rustyflow|python -m rustyflow_py) train "
                     r"--config tiny.env --model-path "
                     r"models/new-cpu.npz --max-steps 3 --resume models/new-cpu.npz", out), out
    assert Checkpoint("models/new-cpu.npz").meta["train"]["step"] == 3
    assert log_records()[-1]["status"] == "interrupted"
    assert_intact(before, snapshot(workspace))


def test_a_second_ctrl_c_at_the_log_block_leaves_the_log_as_it_was(workspace: Path) -> None:
    """Ctrl-C twice while the log block is about to be appended: no block (not part of one)
    is written, and the console names the checkpoint the run did save."""
    before = snapshot(workspace)
    with paused(workspace, "log-append:1", *NEW, "--max-steps", "3") as proc:
        out = Lines(proc.stdout)
        proc.send_signal(signal.SIGINT)
        out.wait_for(r"SIGINT: the run has ended: stopping once its checkpoint and log block "
                     r"are written")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, out.text()
    text = out.text()
    assert ("SIGINT again: stopping now, without saving a checkpoint or the log block; its "
            "best checkpoint models/new-cpu-best.npz holds step 3; models/new-cpu.npz holds "
            "this run's step 3 (--resume models/new-cpu.npz continues from there)") in text
    assert "Traceback" not in text
    assert Path("log.txt").read_bytes() == before["log.txt"]
    assert Checkpoint("models/new-cpu.npz").meta["train"]["step"] == 3
    assert_intact(before, snapshot(workspace))


def test_a_second_ctrl_c_saves_nothing_and_says_what_is_on_disk(workspace: Path) -> None:
    """The same configuration again; Ctrl-C while its best checkpoint is being written, and
    Ctrl-C again: nothing more is written (the cut write leaves no temporary), the console
    says so and what is on disk, and every file of the earlier run is as it was."""
    before = snapshot(workspace)
    with paused(workspace, "checkpoint-rename:1", "--max-steps", "3") as proc:
        out = Lines(proc.stdout)
        proc.send_signal(signal.SIGINT)
        out.wait_for(r"SIGINT: stopping once the checkpoint being written is whole")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, out.text()
    text = out.text()
    assert ("SIGINT again: stopping now, without saving a checkpoint or the log block; this "
            "run wrote no checkpoint, and models/tiny-cpu.npz is as it was before") in text
    assert "Traceback" not in text and "saving checkpoint" not in text
    assert "replaced" not in text
    assert not list(Path("models").glob(".*.tmp")), "a temporary was left behind"
    assert_intact(before, snapshot(workspace))
    assert len(log_records()) == 1


def test_a_second_run_on_a_locked_checkpoint_stops_at_once(workspace: Path) -> None:
    """Two --resume runs of one checkpoint: the second names the first and changes nothing."""
    resume = ("--resume", TRAINED[0], "--max-steps", "5")
    with paused(workspace, "evaluation:1", *resume) as first:
        before = snapshot(workspace)
        second = invoke(*TRAIN, *resume)
        assert second.exit_code == 1
        assert re.search(rf"Error: checkpoint models/tiny-cpu.npz is in use by pid {first.pid} "
                         r"since \S+Z \(host .+\): another run is writing it", second.output)
        assert_intact(before, snapshot(workspace))
    assert first.wait() == 0, first.communicate()[0]
    assert Checkpoint(TRAINED[0]).meta["train"]["step"] == 5
    assert not Path("models/tiny-cpu.npz.lock").exists()


def test_a_killed_write_leaves_a_temporary_the_next_run_removes(workspace: Path) -> None:
    """SIGKILL inside a checkpoint rename orphans its temporary; the next run of that
    checkpoint removes it, and leaves a live writer's temporary and unrelated files alone."""
    with paused(workspace, "checkpoint-rename:1", *NEW, "--max-steps", "3") as proc:
        proc.kill()
    [orphan] = Path("models").glob(".new-cpu-best.npz.rustyflow-*.tmp")
    live = Path(f"models/.new-cpu.npz.rustyflow-{os.getpid()}-abc.tmp")
    live.write_bytes(b"a write in progress")
    other = Path("models/.new-cpu.npz.someone.tmp")
    other.write_bytes(b"not ours")
    before = snapshot(workspace)
    result = invoke(*TRAIN, *NEW, "--max-steps", "3")
    assert result.exit_code == 0, result.output
    assert f"Removed {orphan}, a partial write of models/new-cpu-best.npz" in result.output
    assert not orphan.exists()
    locks = ("models/new-cpu.npz.lock", "models/new-cpu-best.npz.lock")  # stale: taken over
    assert_intact(before, snapshot(workspace), replaced=(str(orphan), *locks))


# ------------------------------------------------------------------------------ the GPU


gpu = pytest.mark.skipif(gpu_unavailable_reason() is not None,
                         reason=str(gpu_unavailable_reason()))


@pytest.mark.gpu
@gpu
def test_gpu_huge_model_is_refused_before_anything_is_built(
        workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    never_built(monkeypatch)
    start = time.perf_counter()
    result = invoke(*TRAIN, *NEW, "--device", "gpu", *HUGE)
    took = time.perf_counter() - start
    assert result.exit_code == 1, result.output
    assert re.search(r"the model does not fit: training L48 E8192 .* of GPU memory \(.*\), "
                     r"but [\d.]+ GiB is free", result.output), result.output
    print(f"refused in {took:.2f}s: {result.output.strip()}")


@pytest.mark.gpu
@gpu
def test_gpu_fp16_overflow_storm_ends_as_failed(workspace: Path) -> None:
    result = invoke(*TRAIN, *NEW, "--device", "gpu", "--precision", "fp16",
                    "--learning-rate", "30", "--grad-clip", "0", "--num-epochs", "100",
                    "--max-steps", "1500", "--log-interval", "10")
    assert result.exit_code == 1, result.output
    assert "loss scale collapsed at step" in result.output, result.output
    record = log_records()[-1]
    assert record["status"] == "failed" and "loss scale collapsed" in record["message"]
    assert not Path("models/new-gpu-best.npz").exists() or all(
        np.isfinite(v).all() for v in Checkpoint("models/new-gpu-best.npz").weights.values())
    print(record["message"])
