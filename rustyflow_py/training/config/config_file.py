"""Reading a config file: python-dotenv's values, with its parse complaints as warnings.

Kept apart from config.py because it knows nothing of the keys: it turns a dotenv file into
strings and warnings, and names what is wrong with a file that sets nothing or sets a key twice.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

from dotenv import dotenv_values
from dotenv.parser import parse_stream

from ...errors import ConfigError
from .config_key import config_error


class _Collect(logging.Handler):
    """Captures python-dotenv's 'could not parse statement' log lines as our warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def read_file(path: Path, label: str) -> tuple[dict[str, str], dict[str, str], list[str],
                                             dict[str, int]]:
    """Return (interpolated values, raw values, warnings, the line each key is set on) of a
    dotenv file."""
    collect = _Collect()
    logger = logging.getLogger("dotenv.main")
    logger.addHandler(collect)
    try:
        values = dotenv_values(path, interpolate=True, encoding="utf-8")
        raw = dotenv_values(path, interpolate=False, encoding="utf-8")
    except UnicodeDecodeError as err:
        raise config_error(f"{label}: not valid UTF-8 at byte {err.start}: expected a text file "
                     f"of KEY=VALUE lines") from None
    finally:
        logger.removeHandler(collect)
    lines = _check_once(path.read_text(encoding="utf-8"), label)
    warnings = [f"{label}: {m}" for m in dict.fromkeys(collect.messages)]
    for key, value in values.items():
        if value is None:
            warnings.append(f"{label}: '{key}' has no value (expected {key}=VALUE); ignored")
    return ({k: v for k, v in values.items() if v is not None},
            {k: v for k, v in raw.items() if v is not None}, warnings, lines)


def no_settings(path: Path, label: str) -> ConfigError:
    """A file that sets nothing: running on the defaults would hide an empty or mangled file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    content = [(i, line.strip()) for i, line in enumerate(lines, 1)
               if line.strip() and not line.lstrip().startswith("#")]
    if content:
        what = f"line {content[0][0]} {content[0][1][:60]!r} is not KEY=VALUE"
    else:
        what = "it holds only comments" if any(line.strip() for line in lines) else "it is empty"
    return config_error(f"{label}: no KEY=VALUE setting found ({what}): expected lines such as "
                  f"BATCH_SIZE=16. A config file that sets nothing is an error, not a run on "
                  f"the built-in defaults; to run on those, use no config file at all")


def _check_once(text: str, label: str) -> dict[str, int]:
    """The line each key is set on (for messages that name it); a ConfigError naming the
    first key the file sets more than once, with every line and value: python-dotenv keeps
    the last silently, so an edit near the top of a long file would otherwise lose to a
    forgotten line further down."""
    lines: dict[str, list[tuple[int, str]]] = {}
    for binding in parse_stream(io.StringIO(text)):
        if binding.key is None:
            continue
        string = binding.original.string  # starts with the blank lines before the binding
        line = binding.original.line + string[: len(string) - len(string.lstrip())].count("\n")
        value = "no value" if binding.value is None else binding.value or "empty"
        lines.setdefault(binding.key, []).append((line, _short(value)))
    key, where = next(((k, v) for k, v in lines.items() if len(v) > 1), ("", []))
    if where:
        times = "twice" if len(where) == 2 else f"{len(where)} times"
        sets = ", ".join(f"line {line}: {value}" for line, value in where)
        raise config_error(f"{label} sets {key} {times} ({sets}): keep one")
    return {k: v[0][0] for k, v in lines.items()}


def _short(value: str) -> str:
    """A value as a message quotes it: one line, at most 40 characters."""
    value = " ".join(value.split()) if "\n" in value else value
    return value if len(value) <= 40 else value[:37] + "..."
