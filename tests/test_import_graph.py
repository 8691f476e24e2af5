"""The import graph of ``src/scopebench``: no cycle, and no package importing one above it.

Every ``import`` statement counts, those inside functions too (a lazy import is still a
dependency; only ``if TYPE_CHECKING:`` blocks are left out), and ``from x import y`` depends
on ``x`` and, when ``y`` is a submodule, on ``x.y``.

:data:`LAYERS` is the order of the top-level packages and modules (docs/design.md): a module
may import its own package and the floors below its own, never a floor above nor another
package of its floor. A new top-level package or module must be given a floor here.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "scopebench"

#: Floors of the top-level packages and modules of ``scopebench``, bottom first ("scopebench"
#: is the package's own ``__init__``).
LAYERS: tuple[tuple[str, ...], ...] = (
    # leaves: no import of the package
    ("scopebench", "validate", "atomic", "stats", "environment", "host_load", "parameters"),
    ("cluster", "host", "allocator"),  # SLURM / Submitit layouts; the machine's record; glibc's settings
    ("distributed", "runs"),  # ranks and process groups; benchopt run records
    ("profiler",),
    ("harness",),  # RankRun and the solver mixin: ranks + profiler + host
    ("train",),
    ("imaging", "policy"),  # the benchmarks' libraries
    ("report", "preflight"),
    ("commands", "validation"),  # the command-line tools; the validation benchmark's library (report's rules scored)
    ("cli",),
)

#: Edges (importer, imported) that close a cycle still being removed.
KNOWN: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skip.update(id(sub) for sub in ast.walk(stmt))
    return skip


def import_graph() -> dict[str, dict[str, int]]:
    """Module -> {imported module of the package: line of the first import}."""
    mods = _modules()
    graph: dict[str, dict[str, int]] = {name: {} for name in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if target in mods and target != name:
                    graph[name].setdefault(target, node.lineno)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    inside = set(component)
    edges = [f"{a} -> {b} (line {graph[a][b]})" for a in component for b in sorted(graph[a]) if b in inside]
    return "cycle: " + ", ".join(component) + "\n    " + "\n    ".join(edges)


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_no_import_cycle():
    graph = import_graph()
    known = strongly_connected(graph)
    without_known = {a: {b: line for b, line in edges.items() if (a, b) not in KNOWN} for a, edges in graph.items()}
    cycles = strongly_connected(without_known)
    assert not cycles, "import cycles (move the shared code down; a lazy import still counts):\n" + "\n".join(
        _describe(c, graph) for c in cycles
    )
    for component in known:  # reported, not failed: each is closed by a KNOWN edge
        warnings.warn("known import cycle, to be removed: " + _describe(component, graph), UserWarning, stacklevel=1)


def test_known_edges_still_exist():
    graph = import_graph()
    gone = sorted((a, b) for a, b in KNOWN if b not in graph.get(a, {}))
    assert not gone, f"these KNOWN edges are gone: delete them from KNOWN in {Path(__file__).name}: {gone}"


def test_every_top_level_package_has_a_floor():
    floors = [name for floor in LAYERS for name in floor]
    assert len(floors) == len(set(floors)), f"a name is on two floors: {floors}"
    missing = sorted({_top(module) for module in import_graph()} - set(floors))
    assert not missing, f"give these top-level packages or modules a floor in LAYERS: {missing}"


def test_no_import_reaches_up_or_across_a_floor():
    floor_of = {name: i for i, floor in enumerate(LAYERS) for name in floor}
    wrong = []
    for module, edges in import_graph().items():
        for target, line in sorted(edges.items()):
            here, there = _top(module), _top(target)
            if here != there and (module, target) not in KNOWN and floor_of[there] >= floor_of[here]:
                wrong.append(
                    f"{module} (floor {floor_of[here]}: {here}) imports {target} "
                    f"(floor {floor_of[there]}: {there}) at line {line}"
                )
    assert not wrong, "imports of a layer above or beside (LAYERS, docs/design.md):\n" + "\n".join(wrong)
