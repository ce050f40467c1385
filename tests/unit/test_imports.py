"""The package's import graph, read from the source with ast (nothing is
imported): no import cycles, and bcc is imported only by the one door to the
kernel (switchml_xdp/bpf/), nowhere else (not even late, inside a function).

An edge A -> B is an import of B written in A, at module level or inside a
function (a late import still ties A to B: it only postpones the cycle).
`from P import name` counts as an import of P.name where that is a module,
else of P. Imports of a module's own parent packages (implicit, or written,
as in `from .. import _engine` of a C extension) are left out: Python has
run them before the module, and a package's __init__ importing its own
submodules is not a cycle. Imports under `if TYPE_CHECKING:` never run and
are left out too.
"""
from __future__ import annotations

import ast
from pathlib import Path

from repo import REPO as ROOT

PACKAGE = ROOT / "switchml_xdp"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(mod: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name `from <node.module>` refers to, in module `mod`."""
    if not node.level:
        return node.module or ""
    base = mod.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _import_nodes(tree: ast.Module, module_level_only: bool):
    """The import statements that run: at module level (also in if/try/class
    bodies), and with module_level_only=False inside functions too."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        elif not (module_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                          ast.Lambda))):
            todo.extend(ast.iter_child_nodes(node))


def imports(mod: str, path: Path, known: set[str], module_level_only: bool = False) -> set[str]:
    """The package's modules that `mod` imports."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {mod.rsplit(".", i)[0] for i in range(1, mod.count(".") + 1)}
    out = set()
    for node in _import_nodes(tree, module_level_only):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            src = _resolve(mod, path.name == "__init__.py", node)
            names = [f"{src}.{a.name}" if f"{src}.{a.name}" in known else src for a in node.names]
        for name in names:
            while name and name not in known:      # `import a.b.c` of a module a.b.c
                name = name.rpartition(".")[0]
            if name and name != mod and name not in parents:
                out.add(name)
    return out


def import_graph(module_level_only: bool = False) -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, p, set(mods), module_level_only) for m, p in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan),
    each as a sorted list: every cycle of the graph lies in one of them."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_package():
    graph = import_graph()
    assert "switchml_xdp.bench.lab_bench" in graph
    assert "switchml_xdp.bench.report" in graph["switchml_xdp.bench.lab_plots"]
    assert "switchml_xdp.wire" in graph["switchml_xdp.bench.constants"]


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_at_module_level():
    assert cycles(import_graph(module_level_only=True)) == []


def test_no_import_cycles_including_late_imports():
    assert cycles(import_graph()) == []


def test_only_the_door_imports_bcc():
    door = PACKAGE / "bpf"
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if door in path.parents:
            continue
        for node in _import_nodes(ast.parse(path.read_text(), str(path)), module_level_only=False):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if not node.level else [])
            if any(n == "bcc" or n.startswith("bcc.") for n in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"bcc imported outside switchml_xdp/bpf/: {offenders}"
