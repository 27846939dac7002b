"""The vocabulary of the config declaration: `key(...)` declares one setting as a field of
`Config`, and `Key` is that declaration read back (parse, range, help, flag).

`key()` returns a dataclass field whose metadata holds everything but the name and the type;
the field supplies those (BATCH_SIZE from `batch_size`, "int" from its annotation), so no fact
about a setting is written twice.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Mapping
from dataclasses import Field, dataclass, field
from typing import Any

from ...errors import ConfigError

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_TYPES = ("int", "float", "bool", "str")


def escape_controls(text: str) -> str:
    """`text` with control and other invisible characters as escapes (\\x1b, \\u202e, \\t).

    Config keys and values are echoed in warnings and errors; a raw escape sequence from a file
    could recolour or rewrite the terminal, and a bidi override could make the line lie.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def config_error(message: str) -> ConfigError:
    """A ConfigError whose quoted keys and values cannot carry control characters."""
    return ConfigError(escape_controls(message))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def key(default: object, help: str, *, choices: tuple[str, ...] = (),  # noqa: A002
        lo: float | None = None, hi: float | None = None, lo_open: bool = False,
        hi_open: bool = False, allow_empty: bool = False, cli: str = "",
        kind: str = "", needs: tuple[str, str] = (), does: str = "") -> Any:
    """Declare a config key as a `Config` field: its default, one-line help, valid values and
    (only when it is not --<key-name>) its command-line flag. `kind="device"` marks the one
    key with its own syntax; a str field with `choices` is a choice. `needs` (KEY, value):
    the key changes nothing unless KEY has that value, and `does` says what it does there
    (Key.applies)."""
    spec = {"help": help, "choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open,
            "hi_open": hi_open, "allow_empty": allow_empty, "cli": cli, "kind": kind,
            "needs": needs, "does": does}
    return field(default=default, metadata={"key": spec})


@dataclass(frozen=True)
class Key:
    """One configuration key: how to parse it, its default and its one-line help."""

    name: str
    type: str  # "int" | "float" | "bool" | "str" | "choice" | "device"
    default: object
    help: str
    choices: tuple[str, ...] = ()
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    allow_empty: bool = False
    cli: str = ""  # the command-line flag when it is not the key's name (--gpus)
    needs: tuple[str, str] = ()  # (KEY, value) without which this key changes nothing
    does: str = ""  # what it does where it applies (for the error where it does not)

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether this key changes anything in a run of these UPPER_CASE `values`."""
        return not self.needs or values.get(self.needs[0]) == self.needs[1]

    @classmethod
    def of_field(cls, f: Field[Any]) -> Key:
        """The Key a `key(...)` field declares; its name and type come from the field."""
        spec = dict(f.metadata["key"])
        kind = spec.pop("kind") or ("choice" if spec["choices"] else str(f.type))
        if kind not in (*_TYPES, "choice", "device"):
            raise TypeError(f"config field {f.name}: type {f.type!r} is not one of {_TYPES}")
        return cls(f.name.upper(), kind, f.default, **spec)

    @property
    def attr(self) -> str:
        """The Config attribute name."""
        return self.name.lower()

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. --batch-size."""
        return self.cli or "--" + self.name.lower().replace("_", "-")

    @property
    def expect(self) -> str:
        """What a valid value looks like, for error messages and help text."""
        if self.type == "bool":
            return "true or false (also 1/0, yes/no, on/off)"
        if self.type == "choice":
            return "one of " + ", ".join(self.choices)
        if self.type == "device":
            return "one of auto, cpu, gpu, or gpu:N for GPU N"
        if self.type == "str":
            return "a string" if self.allow_empty else "a non-empty string"
        if self.type == "int" and self.lo == 1 and self.hi is None:
            return "a positive integer"
        noun = "an integer" if self.type == "int" else "a finite number"
        if self.lo is None:
            return noun
        if self.hi is None:
            return f"{noun} {'>' if self.lo_open else '>='} {_num(self.lo)}"
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f"{noun} in {left}{_num(self.lo)}, {_num(self.hi)}{right}"

    def parse(self, value: object) -> object:
        """Return the typed value of a string or already-typed value; ValueError if invalid."""
        if self.type == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ValueError(self.expect)
        if self.type == "device":
            text = str(value).strip()
            if not re.fullmatch(r"auto|cpu|gpu(:[0-9]+)?", text):
                raise ValueError(self.expect)
            return text
        if self.type in ("str", "choice"):
            text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
            if (self.choices and text not in self.choices) or (not text and not self.allow_empty):
                raise ValueError(self.expect)
            return text
        return self._number(value)

    def _number(self, value: object) -> int | float:
        if isinstance(value, bool):  # bool is an int subclass: True is not a batch size
            raise ValueError(self.expect)
        number: int | float
        if self.type == "int":
            number = int(value) if isinstance(value, numbers.Integral) else int(str(value))
        else:
            number = float(value) if isinstance(value, numbers.Real) else float(str(value))
            if not math.isfinite(number):
                raise ValueError(self.expect)
        if self.lo is not None and (number < self.lo or (self.lo_open and number == self.lo)):
            raise ValueError(self.expect)
        if self.hi is not None and (number > self.hi or (self.hi_open and number == self.hi)):
            raise ValueError(self.expect)
        return number

    def markdown_row(self) -> str:
        """This key's row of docs/configuration.md's table."""
        flag = f"`{self.flag}`" + (f" / `--no-{self.flag[2:]}`" if self.type == "bool" else "")
        value = str(self.default).lower() if isinstance(self.default, bool) else self.default
        default = "*(empty)*" if value == "" else f"`{value}`"
        return f"| `{self.name}` | {flag} | {default} | {self.expect} | {self.help} |"
