"""`rustyflow train --gpus N` (and `--processes N`): a convenience that starts `mpiexec -n N`
on this machine.

Clusters start the ranks themselves (`mpiexec`, `srun`); on a workstation `--gpus N` does it
for the user, once N GPUs are known to be usable (else nothing is started), and `--processes
N` does it on the CPU. MPI's launcher does the work (starting, forwarding signals, killing
every rank when one dies); this module finds it, forwards our stop signals to it once each,
and turns its verdict into one line that names the rank that ended the job: the first to exit
abnormally (the ranks' pid files, left in $RUSTYFLOW_ERROR_DIR, are watched: exits.py). The
line is that rank's own error when it left one (rank-<r>.txt there; a rank that could leave
it prints nothing itself), else how it ended, read from mpiexec's report (MPICH's Hydra is
asked for every rank's exit status). That line replaces MPI's own account of the abort,
which is kept off the screen: only the ranks' own output is passed through.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Protocol

from ..errors import DistributedError
from .exits import ExitOrder
from .mpi import EXTRA_HINT
from .world import World


class Asked(Protocol):
    """What a launch reads of a run's config (training.config.Config has it): the layer
    below the training code names the fields it needs rather than importing the class."""

    num_gpus: int
    device: str
    source: dict[str, str]

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
# MPI's own account of a job it ends, which the one line of `--gpus` replaces. MPICH, from
# the aborting rank: "Abort(1) on node 0 (rank 0 in comm 496): application called
# MPI_Abort(...) - process 0" (older: "[cli_0]: aborting job:" and "application called
# MPI_Abort(MPI_COMM_WORLD, 1) - process 0"); Hydra's "BAD TERMINATION" banner, its exit
# string with two lines of advice, and "[mpiexec@host] Exit codes: ..."; Open MPI's note that
# more processes sent the same message.
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


def find_mpiexec() -> str:
    """The MPI launcher: $RUSTYFLOW_MPIEXEC, the one beside this Python (the `mpi` extra's
    MPICH), else mpiexec on PATH; an error naming the extra when there is none."""
    chosen = os.environ.get("RUSTYFLOW_MPIEXEC")
    if chosen:
        return chosen
    try:
        import mpi4py  # noqa: F401  (the ranks need it as much as the launcher)
    except ImportError:
        raise DistributedError(f"--gpus and --processes start their processes through MPI, "
                               f"and mpi4py is not installed: {EXTRA_HINT}") from None
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.is_file() else shutil.which("mpiexec")
    if found is None:
        raise DistributedError(f"--gpus and --processes start their processes through MPI, "
                               f"and no mpiexec was found: {EXTRA_HINT} (or set "
                               f"RUSTYFLOW_MPIEXEC)")
    return found


def leave_error(rank: int, message: str) -> bool:
    """A failing rank's one line, where `--gpus` looks for it (best effort: it is failing);
    whether it is there, for `--gpus` to print."""
    folder = os.environ.get(ERROR_DIR)
    if folder:
        try:
            Path(folder, f"rank-{rank}.txt").write_text(" ".join(message.split()) + "\n")
            return True
        except OSError:
            pass
    return False


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


def ranks_to_start(cfg: Asked, processes: int | None, world: World) -> int:
    """How many processes `train` starts through mpiexec instead of training itself: N for
    `--gpus N` once N GPUs are usable, or for `--processes N` on the CPU; 0 to train in this
    process (one process, or one that a launcher started, whose count --processes must
    match). `--gpus N` means GPUs: without them it is an error, never N processes that
    quietly share the CPU."""
    gpus = cfg.num_gpus
    if processes is not None and gpus > 1:
        raise DistributedError(f"{_asked(cfg)} asks for one process per GPU and --processes "
                               f"{processes} for processes on the CPU: pass one of them")
    if world.distributed:
        if processes not in (None, world.size):
            raise DistributedError(f"--processes {processes} but the launcher "
                                   f"({world.launcher}) started {world.size} processes: drop "
                                   f"--processes (the launcher's count decides) or make them "
                                   f"agree")
        return 0
    if processes is not None and processes > 1:
        if cfg.device != "cpu":
            raise DistributedError(f"--processes {processes} starts processes on the CPU, but "
                                   f"DEVICE={cfg.device}: add --device cpu, or pass --gpus "
                                   f"{processes} for one process per GPU")
        return processes
    if gpus <= 1:
        return 0
    usable, reason = usable_gpus(gpus)
    if usable == 0:
        raise DistributedError(f"{_asked(cfg)} starts one process per GPU, and no GPU is "
                               f"usable here ({reason}): pass --gpus 1 to train in one "
                               f"process, or --processes {gpus} --device cpu for {gpus} "
                               f"data-parallel processes on the CPU")
    if usable < gpus:
        some = "only 1 GPU is" if usable == 1 else f"only {usable} GPUs are"
        raise DistributedError(f"{_asked(cfg)} starts one process per GPU, and {some} usable "
                               f"here (GPU {usable}: {reason}): pass --gpus {usable}")
    return gpus


def _asked(cfg: Asked) -> str:
    """How NUM_GPUS was asked for: `--gpus 2`, or `NUM_GPUS=2 (tiny.env)`."""
    origin = cfg.source.get("NUM_GPUS", "")
    if origin == "cli":
        return f"--gpus {cfg.num_gpus}"
    where = "the environment" if origin == "env" else origin.removeprefix("file:")
    return f"NUM_GPUS={cfg.num_gpus} ({where})"


# In a child process: how many of GPUs 0..N-1 are usable, up to the first that is not, and why
_PROBE = """import json, sys
from rustyflow_py.engine.devices import gpu_unavailable_reason
wanted = int(sys.argv[1])
found = next(((i, r) for i in range(wanted) if (r := gpu_unavailable_reason(i))), (wanted, None))
print(json.dumps(found))
"""


def usable_gpus(wanted: int) -> tuple[int, str | None]:
    """How many of GPUs 0, 1, ..., wanted - 1 are usable, counting up to the first that is
    not, and why that one is not (None when all are). Asked in a child process: this one
    waits on mpiexec for the whole run, and a CUDA context of its own would take memory from
    rank 0's GPU, or lock rank 0 out of it in the GPU's exclusive-process mode."""
    package = str(Path(__file__).resolve().parents[2])  # the child probes this very package
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [package, os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, str(wanted)], capture_output=True,
                              text=True, timeout=300, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return 0, f"the GPU check could not run: {exc}"
    try:
        usable, reason = json.loads(done.stdout.splitlines()[-1])
        return int(usable), reason
    except (ValueError, IndexError, TypeError):
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return 0, f"the GPU check failed: {said}"


def launch(command: list[str], ranks: int, warn: Callable[[str], None]) -> int:
    """Run `command` as `ranks` MPI processes on this machine; the job's exit status (1 for a
    failed job, after one `Error:` line; 128 + N when a stop signal N ended it)."""
    mpiexec = find_mpiexec()
    args = [mpiexec, *_report_options(mpiexec), "-n", str(ranks), *command]
    with tempfile.TemporaryDirectory(prefix="rustyflow-ranks-") as folder:
        env = {**os.environ, ERROR_DIR: folder}
        warn(f"starting {ranks} processes: {shlex.join(args)}")
        exits = ExitOrder(Path(folder))
        try:
            proc = subprocess.Popen(args, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
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
            # the command failed, with that line: exit 1, whichever status mpiexec chose (1,
            # or 9 when it killed the other ranks after one failed, as the race goes)
            return 1
    return status


def _relay(proc: subprocess.Popen[bytes]) -> list[str]:
    """Pass mpiexec's output through (stdout to stdout, stderr to stderr) but for MPI's own
    account of an abort (see _NOISE); keep the lines that report how a process ended."""
    report: list[str] = []
    assert proc.stdout is not None and proc.stderr is not None
    errors = threading.Thread(target=_pass, args=(proc.stderr, sys.stderr, report), daemon=True)
    errors.start()
    _pass(proc.stdout, sys.stdout, report)
    errors.join()
    return report


def _pass(source: IO[bytes], sink: IO[str], report: list[str]) -> None:
    """One stream of mpiexec's output to `sink`, line by line, through a `Quiet` filter."""
    quiet = Quiet()
    for raw in source:
        line = raw.decode(errors="replace")
        if any(p.search(line) for p in (_HYDRA_PID, _HYDRA_CODE, _HYDRA_ALL, _OMPI)):
            report.append(line)
        _write(sink, quiet(line))
    _write(sink, quiet.rest())


def _write(sink: IO[str], lines: list[str]) -> None:
    if lines:
        sink.write("".join(lines))
        sink.flush()


class Quiet:
    """Drops MPI's own account of an abort from a stream of lines, passing the rest on: the
    lines _NOISE matches, and Open MPI's frames (between lines of dashes) that tell of an
    abort or a death. A frame is held until it closes, then dropped or passed on whole."""

    def __init__(self) -> None:
        self.frame: list[str] | None = None

    def __call__(self, line: str) -> list[str]:
        """The lines to pass on now that `line` came."""
        text = line.rstrip("\r\n")
        if self.frame is None:
            if _FRAME.match(text):
                self.frame = [line]
                return []
            return [] if _NOISE.match(text) else [line]
        self.frame.append(line)
        if not _FRAME.match(text):
            return []
        frame, self.frame = self.frame, None
        return [] if _OMPI_ABORT.search("".join(frame)) else frame

    def rest(self) -> list[str]:
        """A frame that never closed, at the end of the stream."""
        return self.frame or []


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
