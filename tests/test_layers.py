"""The package's layers: imports only go downwards, and nothing imports in a circle.

Every import counts, including those inside functions: a lazy import still ties the two
modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rustyflow_py"

# Lower layers know nothing of higher ones. Layers of equal rank do not import each other.
LAYERS = {"errors": 0, "engine": 1, "data": 1, "model": 2, "reporting": 2, "distributed": 3,
          "training": 4, "interop": 5, "cli_help": 5, "cli": 6, "__main__": 7,
          "__init__": 7}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that `name` imports (resolved, relative imports included)."""
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
            elif node.module and node.module.startswith("rustyflow_py"):
                base = ["rustyflow_py"]
            else:
                continue
            if not node.level:
                mod = node.module.split(".")[1:] if node.module else []
            else:
                mod = node.module.split(".") if node.module else []
            target = [p for p in base if p != "rustyflow_py"] + mod
            for alias in node.names:
                candidate = ".".join([*target, alias.name])
                found.add(candidate if candidate in known else ".".join(target))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("rustyflow_py."):
                    found.add(alias.name[len("rustyflow_py."):])
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _layer(module: str) -> str:
    return module.split(".")[0]


def test_every_module_belongs_to_a_layer() -> None:
    assert {_layer(m) for m in _graph()} <= set(LAYERS)


def test_imports_only_go_down_the_layers() -> None:
    wrong = [f"{a} imports {b}" for a, deps in _graph().items() for b in deps
             if _layer(a) != _layer(b) and LAYERS[_layer(b)] >= LAYERS[_layer(a)]]
    assert wrong == []


def test_no_import_cycles() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []
    assert len(graph) > 30  # the walk saw the package, not an empty folder


# The engine's levels, bottom up: a module imports only its own level and those below.
ENGINE = {
    # the ground floor: facts about the machine, the frozen run policy, and the tools that are
    # handed what they work on (peak memory, CUDA graphs, kernel records, CUPTI, op costs)
    "precision": 0, "devices": 0, "policy": 0, "memory": 0, "graph": 0, "peaks": 0,
    "op_cost": 0, "kernel_records": 0, "cupti_trace": 0, "comm_overlap": 0,
    "backend": 1,  # a device instance: array module, stream, memory; given its kernel set
    # 2: the op library's kernels and kernel sets (every engine.ops module but the functions)
    "library": 3,  # wires the kernel sets into the devices: get_backend
    "autograd": 4,  # Function, run_op, the tape
    # 5: the ops' autograd Functions (engine.ops.*.function, the engine.ops package)
    "regularize": 5, "profiler": 5,
    "tensor": 6,  # Tensor with its operators bound to the ops
    "engine": 7,  # the package
}
KERNELS, FUNCTIONS = 2, 5


def _engine_level(module: str) -> int | None:
    """The level of an engine module (None: one the table above does not place)."""
    parts = module.split(".")
    if parts[:2] == ["engine", "ops"]:
        return FUNCTIONS if len(parts) == 2 or parts[-1] == "function" else KERNELS
    return ENGINE.get(".".join(parts[1:]) or "engine")


def test_every_engine_module_has_a_level() -> None:
    unplaced = [m for m in _graph() if _layer(m) == "engine" and _engine_level(m) is None]
    assert unplaced == []


def test_nothing_in_the_engine_imports_a_module_above_it() -> None:
    """The device layer does not build the op library, the kernels know no autograd, and so
    on up: every import inside the engine runs down (or stays on its level)."""
    graph = _graph()
    wrong = [f"{a} imports {b}" for a, deps in graph.items() if _layer(a) == "engine"
             for b in deps if _layer(b) == "engine"
             and (_engine_level(b) or 0) > (_engine_level(a) or 0)]
    assert wrong == []


# The reporting modules, each one job, in the order they may import each other: the record,
# its numbers as text, what is computed from it, its lines, the block, reading, the report.
REPORTING = ["record_schema", "text", "analysis", "profile_tables", "run_text", "log_writer",
             "log_parser", "report_page"]


def test_reporting_modules_import_in_one_direction() -> None:
    graph = _graph()
    rank = {f"reporting.{name}": i for i, name in enumerate(REPORTING)}
    assert set(rank) <= set(graph)
    wrong = [f"{a} imports {b}" for a in rank for b in graph[a] if b in rank and rank[b] >= rank[a]]
    assert wrong == []
