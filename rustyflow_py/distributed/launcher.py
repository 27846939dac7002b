"""`rustyflow train --gpus N`: a convenience that starts `mpiexec -n N` on this machine.

Clusters start the ranks themselves (`mpiexec`, `srun`); on a workstation `--gpus N` does it
for the user. MPI's launcher does the work (starting, forwarding signals, killing every rank
when one dies); this module finds it, forwards our stop signals to it once each, and turns
its verdict into one line that names the rank that ended the job: the first to exit
abnormally (the ranks' pid files, left in $RUSTYFLOW_ERROR_DIR, are watched: exits.py). The
line is that rank's own error when it left one (rank-<r>.txt there), else how it ended, read
from mpiexec's report (MPICH's Hydra is asked for every rank's exit status).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..errors import DistributedError
from .exits import ExitOrder
from .mpi import EXTRA_HINT

ERROR_DIR = "RUSTYFLOW_ERROR_DIR"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
_HINTS = {signal.SIGKILL: "out of host memory? killed by hand?",
          signal.SIGSEGV: "a crash in native code?", signal.SIGBUS: "a crash in native code?",
          signal.SIGABRT: "a crash in native code?"}
# MPICH's Hydra: "=   PID 9579 RUNNING AT host", later "... EXIT STRING: Killed (signal 9)";
# with -print-all-exitcodes, "[mpiexec@host] Exit codes: [host] 9,11" (wait statuses by rank)
_HYDRA_PID = re.compile(r"PID (\d+) RUNNING AT")
_HYDRA_CODE = re.compile(r"EXIT STRING: .*\(signal (\d+)\)")
_HYDRA_ALL = re.compile(r"Exit codes: \[[^\]]*\] ([\d,]+)[ \t]*$", re.MULTILINE)
# Open MPI: "... process rank 1 with PID 123 on node x exited on signal 9 (Killed)."
_OMPI = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")


def find_mpiexec() -> str:
    """The MPI launcher: $RUSTYFLOW_MPIEXEC, the one beside this Python (the `mpi` extra's
    MPICH), else mpiexec on PATH; an error naming the extra when there is none."""
    chosen = os.environ.get("RUSTYFLOW_MPIEXEC")
    if chosen:
        return chosen
    try:
        import mpi4py  # noqa: F401  (the ranks need it as much as the launcher)
    except ImportError:
        raise DistributedError(f"--gpus starts one process per GPU through MPI, and mpi4py is "
                               f"not installed: {EXTRA_HINT}") from None
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.is_file() else shutil.which("mpiexec")
    if found is None:
        raise DistributedError(f"--gpus starts one process per GPU through MPI, and no "
                               f"mpiexec was found: {EXTRA_HINT} (or set RUSTYFLOW_MPIEXEC)")
    return found


def leave_error(rank: int, message: str) -> None:
    """A failing rank's one line, where `--gpus` looks for it (best effort: it is failing)."""
    folder = os.environ.get(ERROR_DIR)
    if folder:
        try:
            Path(folder, f"rank-{rank}.txt").write_text(" ".join(message.split()) + "\n")
        except OSError:
            pass


def leave_pid(rank: int) -> None:
    """This rank's process id, so `--gpus` can name a rank that MPI reports by pid."""
    folder = os.environ.get(ERROR_DIR)
    if folder:
        try:
            part = Path(folder, f".rank-{rank}.pid.part")
            part.write_text(str(os.getpid()))
            os.replace(part, Path(folder, f"rank-{rank}.pid"))  # whole when seen
        except OSError:
            pass


def launch(command: list[str], ranks: int, warn: Callable[[str], None]) -> int:
    """Run `command` as `ranks` MPI processes on this machine; the job's exit status."""
    mpiexec = find_mpiexec()
    args = [mpiexec, *_report_options(mpiexec), "-n", str(ranks), *command]
    with tempfile.TemporaryDirectory(prefix="rustyflow-ranks-") as folder:
        env = {**os.environ, ERROR_DIR: folder}
        warn(f"starting {ranks} processes: {shlex.join(args)}")
        exits = ExitOrder(Path(folder))
        try:
            proc = subprocess.Popen(args, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_stop_with_parent)
        except OSError as exc:
            exits.stop()
            raise DistributedError(f"cannot start {mpiexec}: {exc.strerror or exc}: "
                                   f"{EXTRA_HINT}") from None
        forward = {s: signal.signal(s, lambda signum, _f: proc.send_signal(signum))
                   for s in _STOP_SIGNALS}
        try:
            report = _relay(proc)
            status = proc.wait()
        finally:
            for s, handler in forward.items():
                signal.signal(s, handler)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            order = exits.stop()
        if status not in (0, *(128 + s for s in _STOP_SIGNALS)):
            warn(f"Error: {_reason(Path(folder), report, status, order)}")
    return status


def _relay(proc: subprocess.Popen[bytes]) -> list[str]:
    """Pass mpiexec's output through; keep the lines that report a killed process."""
    report = []
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode(errors="replace")
        sys.stdout.write(line)
        sys.stdout.flush()
        if any(p.search(line) for p in (_HYDRA_PID, _HYDRA_CODE, _HYDRA_ALL, _OMPI)):
            report.append(line)
    return report


def _report_options(mpiexec: str) -> list[str]:
    """Hydra's flag for every rank's exit status (the default report names one process,
    not always the one that ended the job); Open MPI's report names the rank already."""
    try:
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []  # Popen will say what is wrong with it
    return ["-print-all-exitcodes"] if "HYDRA" in version else []


def _reason(folder: Path, report: list[str], status: int,
            order: list[tuple[int, ...]]) -> str:
    """One line naming the rank that ended the job, and why."""
    errors = {int(p.stem.split("-")[1]): p for p in folder.glob("rank-*.txt")}
    text = "".join(report)
    statuses = _hydra_statuses(text)
    ompi = _OMPI.search(text)
    pids = {p.read_text().strip(): int(p.stem.split("-")[1])
            for p in folder.glob("rank-*.pid")}
    hydra = _HYDRA_PID.search(text)
    reported = int(ompi[1]) if ompi else pids.get(hydra[1]) if hydra else None
    rank = _first_abnormal(order, statuses)
    if rank is None:
        rank = reported if reported is not None or not errors else min(errors)
    if errors:
        return errors.get(rank, errors[min(errors)]).read_text(errors="replace").strip()
    signum = code = None
    if rank in statuses:
        signum, code = (statuses[rank] & 0x7F) or None, statuses[rank] >> 8
    elif rank == reported and ompi:
        signum = int(ompi[2])
    elif rank == reported and (match := _HYDRA_CODE.search(text)):
        signum = int(match[1])
    who = f"rank {rank}" if rank is not None else "a rank"
    if signum is not None:
        hint = _HINTS.get(signum)
        return f"{who} was killed by {_signal_name(signum)}" + (f" ({hint})" if hint else "")
    if code:
        return f"{who} exited with status {code} without saying why; see the output above"
    return f"{who} failed: mpiexec exited with status {status}; see the output above"


def _hydra_statuses(text: str) -> dict[int, int]:
    """Hydra's wait status of every rank (-print-all-exitcodes, one host), by rank."""
    match = _HYDRA_ALL.search(text)
    return dict(enumerate(int(s) for s in match[1].split(","))) if match else {}


def _first_abnormal(order: list[tuple[int, ...]], statuses: dict[int, int]) -> int | None:
    """The first rank to exit other than cleanly (a status of 0; unknown counts as not
    clean); None when the first such exit is shared by several ranks or none was seen."""
    for place in order:
        abnormal = [r for r in place if statuses.get(r, 1) != 0]
        if abnormal:
            return abnormal[0] if len(abnormal) == 1 else None
    return None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _stop_with_parent() -> None:
    """In mpiexec's child, before exec: SIGTERM it if we die (SIGKILLed, say), so the ranks
    stop as from a stop signal instead of running on with nobody to report them, even when
    they print nothing that would break the pipe to us (Linux's PR_SET_PDEATHSIG; elsewhere
    nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
