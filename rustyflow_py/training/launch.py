"""Start and supervise the worker processes of a multi-GPU run on one machine (like torchrun).

A data-parallel run is N copies of the trainer that must start together, agree on a rendezvous,
stop together and fail together. Left alone, one rank that dies (out of memory, a bug) leaves
the others blocked in their next collective, holding their GPUs, and nobody says which rank
died or why. So the launcher:

- gives each worker its rank and the rendezvous in the variables torchrun uses, plus
  RUSTYFLOW_ERROR_FILE, where a failing worker leaves its one-line error for the launcher to
  report (torchrun's TORCHELASTIC_ERROR_FILE);
- starts the workers in sessions of their own, so a terminal's Ctrl-C reaches only the
  launcher, which forwards each stop signal to each worker exactly once: a worker reads a
  second SIGINT as "stop now", so a double delivery would cut its checkpoint short. A third
  Ctrl-C kills the workers, for one stuck where no signal handler runs (inside a collective);
- on the first failure, terminates the others (SIGTERM, then SIGKILL after a grace period) and
  names the rank that failed and why;
- passes rank 0's output through and relays the other ranks' stderr prefixed `[rank k] `
  (their stdout repeats rank 0's and is dropped).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from ..errors import DistributedError
from .signals import HANDLED

MASTER_ADDR = "127.0.0.1"
POLL_SECONDS = 0.1
RELAY_JOIN_SECONDS = 2.0  # a worker's child may hold its stderr open: do not wait on it forever
_HINTS = {
    signal.SIGKILL: "out of host memory? killed by hand?",
    signal.SIGSEGV: "a crash in native code?",
    signal.SIGBUS: "a crash in native code?",
    signal.SIGABRT: "a crash in native code?",
}
_STDERR_LOCK = threading.Lock()


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _shell_status(returncode: int) -> int:
    """The shell's exit status for a subprocess return code (killed by N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def free_port(host: str = MASTER_ADDR) -> int:
    """A TCP port free on `host` now, picked by the OS (another process may take it before the
    workers bind it: the race torchrun accepts too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class WorkerExit:
    """How a worker ended: `returncode` < 0 means killed by signal -returncode; `error` is the
    line it left in its error file ("" when none)."""

    rank: int
    returncode: int
    error: str

    def describe(self) -> str:
        """One line naming the rank and why it ended."""
        if self.returncode < 0:
            hint = _HINTS.get(-self.returncode)
            line = f"rank {self.rank} was killed by {_signal_name(-self.returncode)}"
            line += f" ({hint})" if hint else ""
            return f"{line}: {self.error}" if self.error else line
        why = self.error or "no error message; see its output above"
        return f"rank {self.rank} failed (exit {self.returncode}): {why}"


@dataclass
class _Worker:
    rank: int
    proc: subprocess.Popen[bytes]
    error_file: Path
    relay: threading.Thread | None  # None for rank 0, whose output is not piped

    def error(self) -> str:
        try:
            return self.error_file.read_text(errors="replace").strip()
        except OSError:
            return ""


def _relay(rank: int, stream: IO[bytes]) -> None:
    """Copy a worker's stderr to ours line by line, each line prefixed with its rank."""
    with stream:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\r\n")
            with _STDERR_LOCK:
                sys.stderr.write(f"[rank {rank}] {line}\n")
                sys.stderr.flush()


def _worker_env(base: Mapping[str, str], rank: int, world: int, port: int,
                error_file: Path) -> dict[str, str]:
    return {
        **base,
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),  # one machine: local and global ranks coincide
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": str(port),
        "RUSTYFLOW_LAUNCHER": "1",
        "RUSTYFLOW_ERROR_FILE": str(error_file),
    }


class _Supervisor:
    """The workers of one launch and what happened to them."""

    def __init__(self, say: Callable[[str], None], warn: Callable[[str], None],
                 grace: float) -> None:
        self.say, self.warn, self.grace = say, warn, grace
        self.workers: list[_Worker] = []
        self.exits: dict[int, int] = {}  # rank -> return code, in the order they ended
        self.pending: list[int] = []  # stop signals received, not yet forwarded
        self.forwarded: list[int] = []  # stop signals forwarded, in order
        self.killed: set[int] = set()  # ranks the launcher killed on a third Ctrl-C

    @contextmanager
    def signals_routed(self) -> Iterator[None]:
        """Queue SIGINT/SIGTERM/SIGUSR1 for forwarding while inside (main thread only: Python
        delivers signals there). The handler only queues: the loop forwards, so a signal that
        arrives while workers are still starting reaches all of them."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._on_signal) for s in HANDLED}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.pending.append(signum)

    def start(self, command: list[str], envs: list[dict[str, str]]) -> None:
        for rank, env in enumerate(envs):
            try:  # rank 0 inherits our stdout and stderr; the others' stdout repeats it
                proc = subprocess.Popen(
                    command, env=env, stdout=subprocess.DEVNULL if rank else None,
                    stderr=subprocess.PIPE if rank else None, start_new_session=True)
            except OSError as exc:
                raise DistributedError(
                    f"cannot start the worker command {command[0]!r}: {exc.strerror or exc}"
                ) from exc
            relay = None
            if proc.stderr is not None:
                relay = threading.Thread(target=_relay, args=(rank, proc.stderr),
                                         name=f"rank-{rank}-stderr", daemon=True)
                relay.start()
            self.workers.append(_Worker(rank, proc, Path(env["RUSTYFLOW_ERROR_FILE"]), relay))

    def live(self) -> list[_Worker]:
        return [w for w in self.workers if w.rank not in self.exits]

    def supervise(self) -> int:
        """Wait for every worker; the run's exit status."""
        while True:
            self.forward_pending()
            failure = self.reap()
            if failure is not None:
                self.stop_after(failure)
                return 1
            if not self.live():
                return self.status()
            time.sleep(POLL_SECONDS)

    def forward_pending(self) -> None:
        """Send each queued stop signal once to each live worker (a third SIGINT kills them)."""
        while self.pending:
            signum = self.pending.pop(0)
            live = self.live()
            if signum == signal.SIGINT and self.forwarded.count(signal.SIGINT) >= 2:
                self.warn(f"SIGINT a third time: killing the {len(live)} running workers")
                for w in live:
                    w.proc.kill()
                    self.killed.add(w.rank)
                continue
            for w in live:
                w.proc.send_signal(signum)
            self.forwarded.append(signum)
            if signum == signal.SIGINT and self.forwarded.count(signal.SIGINT) == 2:
                self.say("SIGINT again: the workers stop at once (a third Ctrl-C kills them)")

    def reap(self) -> WorkerExit | None:
        """Record the workers that ended; the first of them that failed, if any."""
        failure = None
        for w in self.live():
            returncode = w.proc.poll()
            if returncode is None:
                continue
            self.exits[w.rank] = returncode
            if failure is None and self._is_failure(w.rank, returncode):
                failure = WorkerExit(w.rank, returncode, w.error())
        return failure

    def _is_failure(self, rank: int, returncode: int) -> bool:
        """Non-zero, and neither the answer to a forwarded stop signal nor a kill of ours."""
        answers = {128 + s for s in self.forwarded} | {-s for s in self.forwarded}
        return returncode != 0 and returncode not in answers and rank not in self.killed

    def stop_after(self, failure: WorkerExit) -> None:
        """SIGTERM the live workers, then SIGKILL those still running after the grace period."""
        live = self.live()
        others = f"the other {len(live)} workers" if len(live) > 1 else "the other worker"
        self.warn(failure.describe() + (f"; stopping {others}" if live else ""))
        for w in live:
            w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while self.live() and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(POLL_SECONDS, left))
            self.forward_pending()
            self.reap()
        for w in self.live():
            self.warn(f"rank {w.rank} did not stop within {self.grace:g} s "
                      f"(stuck in a collective?): killed")
            w.proc.kill()
            self.exits[w.rank] = w.proc.wait()

    def status(self) -> int:
        """The exit status when no worker failed: the first non-zero worker status, else
        128 + the first stop signal forwarded, else 0."""
        for rank, returncode in self.exits.items():
            if returncode != 0 and rank not in self.killed:
                return _shell_status(returncode)
        return 128 + self.forwarded[0] if self.forwarded else 0

    def close(self) -> None:
        """Leave no worker behind (an error in the launcher itself kills them) and let the
        relays print the last lines."""
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
        for w in self.workers:
            if w.relay is not None:
                w.relay.join(RELAY_JOIN_SECONDS)


def launch(
    command: list[str],
    num_workers: int,
    *,
    say: Callable[[str], None] = print,
    warn: Callable[[str], None] = _to_stderr,
    grace: float = 30.0,
    env: Mapping[str, str] | None = None,
    master_port: int | None = None,
) -> int:
    """Start `num_workers` copies of `command`, supervise them, return the exit status.

    0 when all succeed; 1 when one fails (the others are stopped); 128 + N after stop
    signal N was forwarded and the workers answered it. `env` defaults to os.environ.
    """
    if num_workers < 1:
        raise DistributedError(f"a run needs at least 1 worker process, got {num_workers}")
    if not command:
        raise DistributedError("no worker command to launch")
    port = free_port() if master_port is None else master_port
    base = os.environ if env is None else env
    error_dir = Path(tempfile.mkdtemp(prefix="rustyflow-launch-"))
    envs = [_worker_env(base, rank, num_workers, port, error_dir / f"rank-{rank}.txt")
            for rank in range(num_workers)]
    supervisor = _Supervisor(say, warn, grace)
    try:
        with supervisor.signals_routed():
            say(f"starting {num_workers} workers (rendezvous at {MASTER_ADDR}:{port})")
            supervisor.start(command, envs)
            return supervisor.supervise()
    finally:
        supervisor.close()
        shutil.rmtree(error_dir, ignore_errors=True)
