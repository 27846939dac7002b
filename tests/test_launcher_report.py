"""`--gpus`'s one line about a failed job: which rank ended it, and how. MPI's launcher kills
the other ranks once one dies, often with the same SIGKILL, and Hydra's report may name one it
killed; so the line names the first rank to exit abnormally, as the launcher saw them go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rustyflow_py.distributed.exits import ExitOrder
from rustyflow_py.distributed.mpi_report import Quiet, failure_line

_BLOCK = ("=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
          "=   PID {pid} RUNNING AT vm\n=   EXIT CODE: 9\n")
_STRING = "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal {sig})\n"


def _folder(tmp_path: Path, pids: dict[int, int], errors: dict[int, str] | None = None) -> Path:
    for rank, pid in pids.items():
        (tmp_path / f"rank-{rank}.pid").write_text(str(pid))
    for rank, text in (errors or {}).items():
        (tmp_path / f"rank-{rank}.txt").write_text(text + "\n")
    return tmp_path


def test_the_first_rank_to_die_is_named_even_when_hydra_reports_another(tmp_path: Path) -> None:
    """Rank 1 was SIGKILLed; Hydra killed rank 0 in cleanup and its block names rank 0."""
    folder = _folder(tmp_path, {0: 100, 1: 101})
    report = [_BLOCK.format(pid=100), "[mpiexec@vm] Exit codes: [vm] 9,9\n", _STRING.format(sig=9)]
    assert failure_line(folder, report, 9, [(1,), (0,)]) == \
        "rank 1 was killed by SIGKILL (out of host memory? killed by hand?)"


def test_each_rank_s_own_status_gives_the_signal(tmp_path: Path) -> None:
    """Hydra's block and exit string mix two processes (EXIT CODE 9 of the rank it killed, the
    signal 11 of the one that crashed); the per-rank statuses do not."""
    folder = _folder(tmp_path, {0: 100, 1: 101})
    report = [_BLOCK.format(pid=100), "[mpiexec@vm] Exit codes: [vm] 9,11\n",
              _STRING.format(sig=11)]
    line = failure_line(folder, report, 11, [(1,), (0,)])
    assert line == "rank 1 was killed by SIGSEGV (a crash in native code?)"


def test_a_rank_that_exited_cleanly_first_is_passed_over(tmp_path: Path) -> None:
    """Rank 0 finished (status 0) before rank 1 exited with status 3 and no error of its own."""
    folder = _folder(tmp_path, {0: 100, 1: 101})
    report = ["[mpiexec@vm] Exit codes: [vm] 0,768\n"]
    line = failure_line(folder, report, 3, [(0,), (1,)])
    assert line.startswith("rank 1 exited with status 3 without saying why"), line


def test_the_first_rank_s_own_error_wins_over_a_later_one(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {0: 100, 1: 101}, {0: "rank 0 failed: late", 1: "rank 1: first"})
    report = ["[mpiexec@vm] Exit codes: [vm] 256,256\n"]
    assert failure_line(folder, report, 1, [(1,), (0,)]) == "rank 1: first"


def test_without_an_order_the_report_is_trusted(tmp_path: Path) -> None:
    """No pidfds (not Linux), or two ranks seen gone at one look: Hydra's block decides, and
    only its own process's signal is used."""
    folder = _folder(tmp_path, {0: 100, 1: 101})
    report = [_BLOCK.format(pid=101), _STRING.format(sig=9)]
    for order in ([], [(0, 1)]):
        assert failure_line(folder, report, 9, order).startswith("rank 1 was killed by SIGKILL")


def test_open_mpi_names_the_rank_itself(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {0: 100, 1: 101})
    report = ["prterun noticed that process rank 1 with PID 101 on node vm exited on signal 6"
              " (Aborted).\n"]
    assert failure_line(folder, report, 134, []) == \
        "rank 1 was killed by SIGABRT (a crash in native code?)"


def test_the_report_is_what_the_screen_was_spared(tmp_path: Path) -> None:
    """The launcher reads only the lines Quiet kept off the screen: Hydra's whole account
    of a SIGKILL, among the ranks' output (which is passed on, and read as no report)."""
    folder = _folder(tmp_path, {0: 100, 1: 101})
    ours = "  step 3: PID 100 RUNNING AT vm, EXIT STRING: x (signal 11)\n"
    hydra = ["\n", "=" * 83 + "\n", _BLOCK.format(pid=101),
             "[mpiexec@vm] Exit codes: [vm] 15,9\n", _STRING.format(sig=9),
             "This typically refers to a problem with your application.\n"]
    quiet = Quiet()
    shown = [kept for line in [ours, *hydra] for kept in quiet(line)]
    assert shown == [ours, "\n"]
    assert failure_line(folder, quiet.dropped, 9, []) == \
        "rank 1 was killed by SIGKILL (out of host memory? killed by hand?)"


def _leave_pid(folder: Path, rank: int, pid: int) -> None:
    """A pid file written whole, by rename, as launcher.leave_pid writes it (the watcher may
    look at any moment, and a file caught half-written would read empty)."""
    part = folder / f".rank-{rank}.pid.part"
    part.write_text(str(pid))
    os.replace(part, folder / f"rank-{rank}.pid")


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds (kernel 5.3+)")
def test_exit_order_records_processes_as_they_exit(tmp_path: Path) -> None:
    """Three sleeping processes leave pid files; killing them one by one, with pauses longer
    than the watcher's poll, gives that order; one already gone when its file appears takes
    the place of the look that found it."""
    order = ExitOrder(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
             for _ in range(3)]
    try:
        for rank in (2, 0):
            _leave_pid(tmp_path, rank, procs[rank].pid)
        time.sleep(0.3)
        for rank in (2, 0):
            procs[rank].send_signal(signal.SIGKILL)
            procs[rank].wait()
            time.sleep(0.3)
        procs[1].kill()
        procs[1].wait()
        _leave_pid(tmp_path, 1, procs[1].pid)
        time.sleep(0.3)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert order.stop() == [(2,), (0,), (1,)]
