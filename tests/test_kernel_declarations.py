"""What each op family takes from its kernel set is declared (engine/ops/table.py): `uses`,
the set's state and helpers, and `calls`, the other ops it runs.

Read from the source: every `self.<name>` a family class reads is its own (defined on the
class or its bases, or set on the instance) or declared, and every name a class declares it
reads. Against the sets: every class the table names for a device kind takes only what that
kind's set offers (the GPU's too, checked without one), and on the CPU every family is made
with real values. Undeclared names fail loudly."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import numpy as np
import pytest

from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.ops import table
from rustyflow_py.engine.ops.cpu_set import CpuKernels
from rustyflow_py.engine.ops.cuda_set import CudaKernels
from rustyflow_py.engine.ops.reference_set import XpKernels
from rustyflow_py.engine.ops.table import Family, declared

SETS = {"reference": XpKernels, "cpu": CpuKernels, "gpu": CudaKernels}
BASE = {"xp", "backend"}  # what Family.__init__ gives every instance


def families() -> list[type[Family]]:
    """Every class the table names, and the Family classes they extend."""
    found = {base for cls in table.entries().values() for base in cls.__mro__
             if issubclass(base, Family) and base is not Family}
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


def self_names(cls: type) -> tuple[set[str], set[str]]:
    """(read, assigned): the `self.<name>` attributes the class's own source reads and
    assigns (nested functions included)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    read, assigned = set(), set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self"):
            (assigned if isinstance(node.ctx, ast.Store) else read).add(node.attr)
    return read, assigned


def undeclared(cls: type[Family]) -> list[str]:
    """The names cls reads from self that nothing gives it."""
    read, _ = self_names(cls)
    own = BASE | set(cls.taken)
    for base in cls.__mro__:
        if issubclass(base, Family) and base is not Family:
            own |= self_names(base)[1]
    return sorted(name for name in read if name not in own and not hasattr(cls, name))


def unused(cls: type[Family]) -> list[str]:
    """The names cls itself declares (not its bases) that its own source never reads."""
    read, _ = self_names(cls)
    mine = (*vars(cls).get("uses", ()), *vars(cls).get("calls", ()))
    return [name for name in mine if name not in read]


@pytest.mark.parametrize("cls", families(), ids=lambda c: c.__name__)
def test_a_family_reads_only_what_it_has_or_declares(cls: type[Family]) -> None:
    assert undeclared(cls) == []
    assert unused(cls) == []


def test_the_source_check_finds_an_undeclared_name() -> None:
    class Sloppy(Family):
        calls = ("matmul",)

        def kernel(self, x: Any) -> Any:
            return self._parallel(self.matmul(x, x))

    assert undeclared(Sloppy) == ["_parallel"]


def test_the_source_check_finds_a_declaration_never_read() -> None:
    class Stale(Family):
        uses = ("_parallel",)

        def kernel(self, x: Any) -> Any:
            return self.xp.sum(x)

    assert unused(Stale) == ["_parallel"]


def test_declarations_add_up_along_the_bases() -> None:
    class Base(Family):
        calls = ("add",)

    class Device(Base):
        uses = ("_parallel",)

    assert declared(Device, "calls") == ("add",) and Device.taken == ("_parallel", "add")


@pytest.mark.parametrize("kind", table.KINDS)
def test_every_entry_takes_only_what_its_kind_offers(kind: str) -> None:
    offers = SETS[kind].offers
    unmet = {cls.__name__: table.unmet(cls, offers)
             for (_, k, _), cls in table.entries().items() if k == kind}
    assert {name: names for name, names in unmet.items() if names} == {}


@pytest.mark.parametrize("kind", ["reference", "cpu"])
def test_every_family_of_a_set_is_made_with_what_it_declares(kind: str) -> None:
    """On a real set: each offered name exists, and each family made receives the set's own
    values (a dispatcher for a call, the same helper object for a use)."""
    backend = get_backend("cpu")
    kernels = backend.kernels if kind == "cpu" else XpKernels(backend)
    assert [name for name in kernels.offers if not hasattr(kernels, name)] == []
    for cls in {c for (_, k, _), c in table.entries().items() if k == kind}:
        made = kernels.family(cls)
        for name in cls.taken:
            assert getattr(made, name) == getattr(kernels, name), (cls.__name__, name)
            assert name in vars(made)  # a plain instance attribute: no lookup per call


def test_a_family_taking_what_its_set_does_not_offer_fails_when_made() -> None:
    class NeedsCublas(Family):
        uses = ("_lt",)

    class CallsNothing(Family):
        calls = ("no_such_op",)

    kernels = get_backend("cpu").kernels
    with pytest.raises(TypeError, match="NeedsCublas takes _lt from the cpu kernel set"):
        kernels.family(NeedsCublas)
    with pytest.raises(TypeError, match="CallsNothing takes no_such_op"):
        kernels.family(CallsNothing)


def test_an_undeclared_name_is_an_attribute_error() -> None:
    class Sloppy(Family):
        def kernel(self, x: Any) -> Any:
            return self._ones_vector(x.shape[0], x.dtype)

    made = get_backend("cpu").kernels.family(Sloppy)
    with pytest.raises(AttributeError, match="_ones_vector"):
        made.kernel(np.zeros(3, np.float32))


def test_declaring_a_name_the_class_defines_is_refused() -> None:
    with pytest.raises(TypeError, match="Shadow defines add"):
        class Shadow(Family):
            calls = ("add",)

            def add(self, a: Any, b: Any) -> Any:
                return a + b
