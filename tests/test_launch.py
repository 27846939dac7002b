"""The multi-process launcher, driven with fake workers: `python -c` scripts that read the
environment the launcher gives them and fail, hang or answer signals on cue (no training)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rustyflow_py.errors import DistributedError
from rustyflow_py.training.launch import free_port, launch

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "RUSTYFLOW_LAUNCHER", "RUSTYFLOW_ERROR_FILE")

# What every fake worker starts with: its rank, the test's folder, and a handshake (each
# worker writes ready-<rank> once its signal handlers are in place).
PRELUDE = """\
import json, os, signal, sys, time
from pathlib import Path
RANK = int(os.environ["RANK"])
OUT = Path(os.environ["OUT"])
def ready():
    (OUT / f"ready-{RANK}").write_text(str(os.getpid()))
def await_ready(*ranks):
    while not all((OUT / f"ready-{r}").exists() for r in ranks):
        time.sleep(0.01)
"""

# Sleeps until told to stop; records each stop signal it gets, one line each, and exits
# 128 + signal once it has had $WANT of them (after a pause in which a duplicate would show).
COUNTING_WORKER = PRELUDE + """
got = []
def on_signal(signum, frame):
    got.append(signum)
    with open(OUT / f"signals-{RANK}", "a") as f:
        f.write(signal.Signals(signum).name + "\\n")
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, on_signal)
ready()
deadline = time.monotonic() + 20
while len(got) < int(os.environ["WANT"]) and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.3)
sys.exit(128 + got[-1] if got else 99)
"""

LAUNCHER = """\
import sys
from rustyflow_py.training.launch import launch
sys.exit(launch([sys.executable, "-c", sys.argv[1]], 2, grace=5))
"""


def run_workers(tmp_path: Path, body: str, num_workers: int = 2,
                **kwargs: Any) -> tuple[int, list[str], float]:
    """Launch `body` (after PRELUDE) in-process: (exit status, warnings, seconds taken)."""
    warnings: list[str] = []
    start = time.monotonic()
    status = launch([sys.executable, "-c", PRELUDE + body], num_workers, say=lambda _: None,
                    warn=warnings.append, env={**os.environ, "OUT": str(tmp_path)}, **kwargs)
    return status, warnings, time.monotonic() - start


def wait_until(done: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# ------------------------------------------------------------------------------ startup


@pytest.mark.parametrize("given_port", [False, True], ids=["free-port", "given-port"])
def test_each_worker_gets_its_rank_and_the_rendezvous(tmp_path: Path, given_port: bool) -> None:
    port = free_port() if given_port else None
    body = f"(OUT / f'env-{{RANK}}.json').write_text(json.dumps({{k: os.environ.get(k) "\
           f"for k in {ENV_KEYS!r}}}))"
    status, warnings, _ = run_workers(tmp_path, body, 3, master_port=port)
    assert (status, warnings) == (0, [])
    envs = [json.loads((tmp_path / f"env-{r}.json").read_text()) for r in range(3)]
    for rank, env in enumerate(envs):
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["RUSTYFLOW_LAUNCHER"] == "1"
        assert Path(env["RUSTYFLOW_ERROR_FILE"]).name == f"rank-{rank}.txt"
    assert len({env["MASTER_PORT"] for env in envs}) == 1
    assert int(envs[0]["MASTER_PORT"]) == port if port else int(envs[0]["MASTER_PORT"]) > 0
    error_dir = Path(envs[0]["RUSTYFLOW_ERROR_FILE"]).parent
    assert not error_dir.exists(), "the launcher's temp dir is removed at the end"


def test_rank0_output_passes_through_and_other_ranks_stderr_is_prefixed(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    body = 'print(f"out {RANK}"); print(f"err {RANK}", file=sys.stderr)'
    status, _, _ = run_workers(tmp_path, body, 3)
    out, err = capfd.readouterr()
    assert status == 0
    assert "out 0" in out and "out 1" not in out and "out 2" not in out
    assert "[rank 1] err 1\n" in err and "[rank 2] err 2\n" in err
    assert "err 0" in err and "[rank 0]" not in err


def test_no_workers_or_a_missing_command_is_a_distributed_error(tmp_path: Path) -> None:
    with pytest.raises(DistributedError, match="at least 1 worker"):
        launch([sys.executable, "-c", "pass"], 0)
    missing = str(tmp_path / "no-such-trainer")
    with pytest.raises(DistributedError, match="no-such-trainer"):
        launch([missing], 2, say=lambda _: None)


# ------------------------------------------------------------------------------ failures


def test_a_failing_rank_is_named_with_its_error_and_the_others_are_terminated(
        tmp_path: Path) -> None:
    body = """
if RANK == 1:
    await_ready(0, 2, 3)
    Path(os.environ["RUSTYFLOW_ERROR_FILE"]).write_text("boom: bad thing\\n")
    sys.exit(3)
def on_term(signum, frame):
    (OUT / f"stopped-{RANK}").write_text(signal.Signals(signum).name)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
ready()
time.sleep(30)
"""
    status, warnings, seconds = run_workers(tmp_path, body, 4)
    assert status == 1
    assert warnings == ["rank 1 failed (exit 3): boom: bad thing; stopping the other 3 workers"]
    assert [(tmp_path / f"stopped-{r}").read_text() for r in (0, 2, 3)] == ["SIGTERM"] * 3
    assert seconds < 10


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    body = """
if RANK == 1:
    await_ready(0)
    sys.exit(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ready()
time.sleep(30)
"""
    status, warnings, seconds = run_workers(tmp_path, body, grace=0.5)
    assert status == 1
    assert warnings == [
        "rank 1 failed (exit 1): no error message; see its output above; stopping the other "
        "worker",
        "rank 0 did not stop within 0.5 s (stuck in a collective?): killed",
    ]
    assert 0.5 <= seconds < 10


def test_a_worker_killed_by_a_signal_is_named_with_the_signal(tmp_path: Path) -> None:
    body = """
if RANK == 1:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(30)
"""
    status, warnings, seconds = run_workers(tmp_path, body)
    assert status == 1
    assert warnings == ["rank 1 was killed by SIGKILL (out of host memory? killed by hand?); "
                        "stopping the other worker"]
    assert seconds < 10


# ------------------------------------------------------------------------------ stop signals


def start_launcher(tmp_path: Path, want: int) -> subprocess.Popen[str]:
    """The launcher in a process of its own, so the test can signal it; returns once both
    workers have their handlers in place."""
    env = {**os.environ, "OUT": str(tmp_path), "WANT": str(want)}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, COUNTING_WORKER], cwd=REPO_ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    wait_until(lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), "the workers")
    return launcher


def signal_in_turn(launcher: subprocess.Popen[str], tmp_path: Path,
                   signals: list[signal.Signals]) -> None:
    """Send each signal once the workers have the one before (two pending deliveries of one
    signal would merge into one)."""
    for count, signum in enumerate(signals, 1):
        launcher.send_signal(signum)
        wait_until(lambda n=count: all(len(lines(tmp_path / f"signals-{r}")) >= n
                                       for r in (0, 1)), f"{signum.name} #{count}")


@pytest.mark.parametrize("signals", [
    [signal.SIGTERM], [signal.SIGUSR1], [signal.SIGINT, signal.SIGINT],
], ids=["SIGTERM", "SIGUSR1", "SIGINT-twice"])
def test_each_stop_signal_is_forwarded_to_each_worker_exactly_once(
        tmp_path: Path, signals: list[signal.Signals]) -> None:
    launcher = start_launcher(tmp_path, want=len(signals))
    try:
        signal_in_turn(launcher, tmp_path, signals)
        _, err = launcher.communicate(timeout=10)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signals[0], err
    for rank in (0, 1):
        assert lines(tmp_path / f"signals-{rank}") == [s.name for s in signals]


def test_a_third_sigint_kills_the_workers(tmp_path: Path) -> None:
    launcher = start_launcher(tmp_path, want=99)  # never stops by itself
    try:
        signal_in_turn(launcher, tmp_path, [signal.SIGINT, signal.SIGINT])
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=10)
    finally:
        launcher.kill()
    assert launcher.returncode == 130, err
    assert "SIGINT a third time: killing the 2 running workers" in err
    for rank in (0, 1):
        assert len(lines(tmp_path / f"signals-{rank}")) == 2
        with pytest.raises(ProcessLookupError):  # reaped by the launcher before it returned
            os.kill(int((tmp_path / f"ready-{rank}").read_text()), 0)
