"""What a person sees: a command run on a pseudo-terminal, its output fed to a terminal
emulator (pyte), the final screen returned. Shared by the terminal tests and by
scripts/readme_examples.py, which puts such screens into the README.

`shape()` reduces an output line to its format (numbers, paths and the machine's name
replaced), so a README example from a real run can be checked against today's output of a
tiny run: the lines must still have the same form, not the same numbers.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import termios
import time
from collections.abc import Callable, Sequence
from pathlib import Path

COLS, ROWS = 120, 60
BAR = "━"


def on_screen(argv: Sequence[str], cwd: Path, interrupt: Callable[[list[str]], bool] | None = None,
              env: dict[str, str] | None = None, cols: int = COLS, rows: int = ROWS,
              timeout: float = 300) -> tuple[list[str], int]:
    """Run `argv` on a pseudo-terminal of cols x rows, feeding everything it writes to a pyte
    screen; send one SIGINT as soon as `interrupt(screen lines)` is true, SIGKILL after
    `timeout` seconds. Returns the final screen (right-stripped lines) and the exit status."""
    import pyte

    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdout and stderr are the terminal
        os.environ.update(env or {})
        os.environ.update(COLUMNS=str(cols), LINES=str(rows), TERM="xterm")
        os.chdir(cwd)
        os.execvp(argv[0], list(argv))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    screen = pyte.Screen(cols, rows)
    stream = pyte.ByteStream(screen)
    sent, deadline = False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:  # EIO: the child has exited and the terminal is closed
                break
            if not chunk:
                break
            stream.feed(chunk)
        if interrupt and not sent and interrupt(screen.display):
            os.kill(pid, signal.SIGINT)
            sent = True
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return [line.rstrip() for line in screen.display], os.waitstatus_to_exitcode(status)


def content(screen: list[str]) -> list[str]:
    """The screen's lines from the first to the last non-empty one."""
    filled = [i for i, line in enumerate(screen) if line.strip()]
    return screen[filled[0]: filled[-1] + 1] if filled else []


def bar_counts(line: str) -> tuple[int, int]:
    """(done, total) of a bar line (after its `epoch E/N` label)."""
    match = re.search(r" (\d+)/(\d+) +loss ", line)
    if not match:
        raise ValueError(f"not a bar line: {line!r}")
    return int(match.group(1)), int(match.group(2))


def shape(line: str, names: Sequence[str] = ()) -> str:
    """The format of an output line: `names` (a hardware or dataset name) become `NAME`,
    paths `PATH`, numbers `#`, runs of spaces one space, the bar's glyphs `BAR`."""
    for name in sorted(names, key=len, reverse=True):
        line = line.replace(name, "NAME")
    line = re.sub(r"[━╺╸]+", "BAR", line)
    line = re.sub(r"(?<![\w.])[\w.~-]*/[\w./~-]*", "PATH", line)
    line = re.sub(r"\d[\d,.:]*", "#", line)
    return re.sub(r"\s+", " ", line).strip()
