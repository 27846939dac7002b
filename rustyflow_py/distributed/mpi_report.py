"""MPI's account of a failed job, as `--gpus`'s launcher reads it: kept off the screen, and
turned into one line that names the rank that ended the job.

No switch of mpiexec hides that account: Hydra prints its BAD TERMINATION banner always, and
MPICH's MPIR_CVAR_SUPPRESS_ABORT_MESSAGE=1 still prints "Abort(1) on node 1 (rank 1 in comm
0): ", the advice cut but not the line. So `Quiet` drops it line by line, and what it dropped
is the report the launcher reads. That report names one process or none: MPICH's Hydra one
pid (sometimes a rank it killed itself in cleanup), Open MPI one rank; so the line prefers the
first rank seen to exit abnormally (exits.py), its own error file, and Hydra's status of every
rank (-print-all-exitcodes).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path

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
# MPI's own account of a job it ends. MPICH, from the aborting rank: "Abort(1) on node 0
# (rank 0 in comm 496): application called MPI_Abort(...) - process 0" (older: "[cli_0]:
# aborting job:" and "application called MPI_Abort(MPI_COMM_WORLD, 1) - process 0"); Hydra's
# "BAD TERMINATION" banner, its exit string with two lines of advice, and "[mpiexec@host]
# Exit codes: ..."; Open MPI's note that more processes sent the same message.
_NOISE = re.compile(
    r"^(Abort\(\d+\) on node \d+|application called MPI_Abort|\[cli_\d+\]: aborting job"
    r"|=+$|=   |YOUR APPLICATION TERMINATED WITH THE EXIT STRING"
    r"|This typically refers to a problem with your application"
    r"|Please see the FAQ page for debugging suggestions|\[mpiexec@[^\]]*\] Exit codes:"
    r"|\[[^\]]+\] \d+ more process(es)? ha(s|ve) sent help message"
    r"|\[[^\]]+\] Set MCA parameter \"orte_base_help_aggregate\")")
# Open MPI frames its messages in lines of dashes; these frames tell of an abort or a death
_FRAME = re.compile(r"^-{60,}$")
_OMPI_ABORT = re.compile(r"MPI_ABORT was invoked|noticed that process rank|has exited due to "
                         r"process rank|returned\s+a non-zero exit code")


class Quiet:
    """Drops MPI's own account of an abort from a stream of lines, passing the rest on: the
    lines _NOISE matches, and Open MPI's frames (between lines of dashes) that tell of an
    abort or a death. A frame is held until it closes, then dropped or passed on whole.
    `dropped` keeps what was dropped: MPI's report, for `failure_line`."""

    def __init__(self) -> None:
        self.dropped: list[str] = []
        self.frame: list[str] | None = None

    def __call__(self, line: str) -> list[str]:
        """The lines to pass on now that `line` came."""
        text = line.rstrip("\r\n")
        if self.frame is None:
            if _FRAME.match(text):
                self.frame = [line]
                return []
            return self._drop([line]) if _NOISE.match(text) else [line]
        self.frame.append(line)
        if not _FRAME.match(text):
            return []
        frame, self.frame = self.frame, None
        return self._drop(frame) if _OMPI_ABORT.search("".join(frame)) else frame

    def rest(self) -> list[str]:
        """A frame that never closed, at the end of the stream."""
        return self.frame or []

    def _drop(self, lines: list[str]) -> list[str]:
        self.dropped += lines
        return []


@dataclass(frozen=True)
class Report:
    """What MPI's report says of how the job ended: every rank's wait status (Hydra with
    -print-all-exitcodes, one host), the one process it names (Open MPI by rank, Hydra by
    pid) and that process's signal."""

    statuses: dict[int, int]
    rank: int | None
    pid: str | None
    signum: int | None

    @classmethod
    def read(cls, text: str) -> Report:
        every = _HYDRA_ALL.search(text)
        statuses = dict(enumerate(int(s) for s in every[1].split(","))) if every else {}
        if ompi := _OMPI.search(text):
            return cls(statuses, int(ompi[1]), None, int(ompi[2]))
        pid, code = _HYDRA_PID.search(text), _HYDRA_CODE.search(text)
        return cls(statuses, None, pid[1] if pid else None, int(code[1]) if code else None)


def failure_line(folder: Path, report: list[str], status: int,
                 order: list[tuple[int, ...]]) -> str:
    """One line naming the rank that ended the job, and why: its own error (rank-<r>.txt in
    `folder`) when it left one, else how it ended. `folder` also holds the ranks' pid files,
    `report` is what Quiet dropped, `status` mpiexec's and `order` the ranks' exits seen."""
    errors = {int(p.stem.split("-")[1]): p for p in folder.glob("rank-*.txt")}
    told = Report.read("".join(report))
    pids = {p.read_text().strip(): int(p.stem.split("-")[1])
            for p in folder.glob("rank-*.pid")}
    reported = told.rank if told.rank is not None else pids.get(told.pid) if told.pid else None
    rank = _first_abnormal(order, told.statuses)
    if rank is None:
        rank = reported if reported is not None or not errors else min(errors)
    if errors:
        return errors.get(rank, errors[min(errors)]).read_text(errors="replace").strip()
    signum = code = None
    if rank in told.statuses:
        signum, code = (told.statuses[rank] & 0x7F) or None, told.statuses[rank] >> 8
    elif rank == reported:
        signum = told.signum
    who = f"rank {rank}" if rank is not None else "a rank"
    if signum is not None:
        hint = _HINTS.get(signum)
        return f"{who} was killed by {_signal_name(signum)}" + (f" ({hint})" if hint else "")
    if code:
        return f"{who} exited with status {code} without saying why; see the output above"
    return f"{who} failed: mpiexec exited with status {status}; see the output above"


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
