"""`rustyflow train --gpus N` (and `--processes N`): starts `mpiexec -n N` on this machine.

Clusters start the ranks themselves (`mpiexec`, `srun`); on a workstation `--gpus N` does it
for the user, once N GPUs are known to be usable (else nothing is started), and `--processes
N` does it on the CPU. mpiexec does the launch (starting the ranks, passing signals on, ending
every rank when one dies); this module does only what it does not:

- the `mpi` extra's mpiexec is on PATH only in an activated venv, so it is looked for beside
  this Python first;
- mpiexec runs in a session of its own (a Ctrl-C reaches it once, from us, not also from the
  terminal), so it hears of our stop signals only when we forward them, once each;
- mpiexec is not told when we are SIGKILLed, so it gets SIGTERM then (PR_SET_PDEATHSIG);
- mpiexec relays every rank's output, so ranks that fail alike would print the same error
  each: a rank leaves its line in $RUSTYFLOW_ERROR_DIR instead, printed once here;
- mpiexec's report names one process, not always the one that ended the job, so the ranks
  leave their pids there, their exits are watched in order (exits.py), and Hydra is asked for
  every rank's exit status;
- no option of mpiexec silences its account of the abort, which that one line replaces, so it
  is kept off the screen and read (mpi_report.py).
"""

from __future__ import annotations

import functools
import json
import os
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
from .mpi_report import Quiet, failure_line
from .world import World


class Asked(Protocol):
    """What a launch reads of a run's config (training.config.Config has it): the layer
    below the training code names the fields it needs rather than importing the class."""

    num_gpus: int
    device: str
    source: dict[str, str]


ERROR_DIR = "RUSTYFLOW_ERROR_DIR"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


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
                                    start_new_session=True, preexec_fn=_parent_death_signal())
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
            warn(f"Error: {failure_line(Path(folder), report, status, order)}")
            # the command failed, with that line: exit 1, whichever status mpiexec chose (1,
            # or 9 when it killed the other ranks after one failed, as the race goes)
            return 1
    return status


def _relay(proc: subprocess.Popen[bytes]) -> list[str]:
    """Pass mpiexec's output through (stdout to stdout, stderr to stderr) but for MPI's own
    account of the job's end, which is returned instead (mpi_report.Quiet)."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Quiet(), Quiet()
    errors = threading.Thread(target=_pass, args=(proc.stderr, sys.stderr, err), daemon=True)
    errors.start()
    _pass(proc.stdout, sys.stdout, out)
    errors.join()
    return out.dropped + err.dropped


def _pass(source: IO[bytes], sink: IO[str], quiet: Quiet) -> None:
    """One stream of mpiexec's output to `sink`, line by line, through `quiet`."""
    for raw in source:
        _write(sink, quiet(raw.decode(errors="replace")))
    _write(sink, quiet.rest())


def _write(sink: IO[str], lines: list[str]) -> None:
    if lines:
        sink.write("".join(lines))
        sink.flush()


def _report_options(mpiexec: str) -> list[str]:
    """Hydra's flag for every rank's exit status (the default report names one process,
    not always the one that ended the job); Open MPI's report names the rank already."""
    try:
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []  # Popen will say what is wrong with it
    return ["-print-all-exitcodes"] if "HYDRA" in version else []


def _parent_death_signal() -> Callable[[], object] | None:
    """For mpiexec's child, before exec: SIGTERM it when we die, so the ranks stop as from a
    stop signal instead of running on with nobody to report them. Linux's PR_SET_PDEATHSIG is
    the only notice a SIGKILL of ours gives (the pipe breaks only when a rank prints); no
    binding in the standard library, so ctypes, resolved here rather than in the forked
    child. Elsewhere nothing."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return functools.partial(prctl, 1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
