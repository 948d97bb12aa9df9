"""The layout as a specification: imports flow one way (ARCHITECTURE.md, "Packages").

Every module's imports are read from its source (top level and inside functions alike; only
`if TYPE_CHECKING:` blocks are left out, as they never run), so a lazy import that closes a loop is
caught as surely as a top-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "trex_compiler": "trex",
    "cost_model": "trex.cost_model",
    "planner": "trex.planner",
    "passes": "trex.passes",
    "backends": "trex.backends",
    "runtime": "trex.runtime",
    "workloads": "trex.workloads",
}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path) -> set[str]:
    """The trex modules `module` imports (resolved to modules that exist)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    resolved = set()
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name.startswith("trex") and name != module:
            resolved.add(name)
    return resolved


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for module, path in MODULES.items():
        g.add_node(module)
        for target in _imports(module, path):
            g.add_edge(module, target)
    return g


def _room(module: str) -> str:
    for package in sorted(FOLDERS.values(), key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return package
    raise AssertionError(module)


def test_the_import_walk_sees_the_whole_tree(graph):
    assert {
        "trex.api",
        "trex.driver",
        "trex.cost_model.step",
        "trex.planner.search",
        "trex.passes.canonicalize.moe",
        "trex.workloads.or_eval.cli",
    } <= set(graph)
    assert graph.has_edge("trex.driver", "trex.pass_manager")


def test_no_module_imports_itself_back(graph):
    cycles = list(nx.simple_cycles(graph))
    shown = "\n".join(" -> ".join([*c, c[0]]) for c in sorted(cycles, key=len)[:10])
    assert not cycles, f"{len(cycles)} import cycle(s), the shortest:\n{shown}"


def test_the_compiler_and_the_cost_model_never_import_the_workloads(graph):
    offenders = sorted((a, b) for a, b in graph.edges if _room(b) == "trex.workloads" and _room(a) != "trex.workloads")
    assert not offenders, offenders


def test_the_cost_model_is_pure(graph):
    """cost_model -> nothing of trex but errors and the model catalog (data; no torch, no capture), and
    trex's operator definitions, which calibration times on this machine."""
    allowed = {"trex.errors", "trex.models", "trex.ops", "trex.ops.moe"}
    offenders = sorted(
        (a, b)
        for a, b in graph.edges
        if _room(a) == "trex.cost_model" and _room(b) != "trex.cost_model" and b not in allowed
    )
    assert not offenders, offenders


def test_the_planner_needs_no_graph(graph):
    """The planner searches over ModelSpec: it reads the cost model and hands out Plans, nothing else."""
    allowed = {"trex.errors", "trex.models", "trex.plan"}
    offenders = sorted(
        (a, b)
        for a, b in graph.edges
        if _room(a) == "trex.planner" and _room(b) not in ("trex.planner", "trex.cost_model") and b not in allowed
    )
    assert not offenders, offenders


def test_the_plan_contract_does_not_capture(graph):
    reachable = nx.descendants(graph, "trex.plan")
    assert not reachable & {"trex.meta_capture", "trex.driver", "trex.capture", "trex.api"}, sorted(reachable)


def _defines_a_pass(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(
        isinstance(n, ast.ClassDef) and any(isinstance(f, ast.FunctionDef) and f.name == "run" for f in n.body)
        for n in ast.walk(tree)
    )


def test_passes_hold_graph_passes_only():
    """passes/ holds one pass per module or sub-package: every top-level module there defines a pass
    class (with `run`), and every sub-package has a module that does (its other modules serve it).
    The deprecated planner alias (`passes/parallel/`) is the one exception, for one release."""
    root = ROOT / "passes"
    for path in sorted(root.iterdir()):
        if path.name.startswith(("_", ".")) or path.name == "parallel":
            continue
        if path.is_dir():
            assert any(_defines_a_pass(p) for p in path.rglob("*.py")), (
                f"passes/{path.name}/ defines no pass (a class with run(gm, ctx))"
            )
        elif path.suffix == ".py":
            assert _defines_a_pass(path), (
                f"passes/{path.name} is in passes/ but defines no pass (a class with run(gm, ctx))"
            )


def _top_level_names(path: Path) -> tuple[set[str], bool]:
    """Names a module defines at run time (defs, classes, assignments, imports), and whether it has a
    module-level __getattr__ (names it resolves lazily)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    lazy = False

    def visit(body: list[ast.stmt]) -> None:
        nonlocal lazy
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                lazy |= node.name == "__getattr__"
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
                    names.update(e.id for e in elements if isinstance(e, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If) and not _is_type_checking(node):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)

    visit(tree.body)
    return names, lazy


def test_every_name_imported_from_trex_exists():
    """`from trex.x import name` (lazy imports too) names something trex.x defines: a module that
    moved leaves no import behind that fails only when its function runs."""
    definitions = {module: _top_level_names(path) for module, path in MODULES.items()}
    missing = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("trex"):
                continue
            if node.module not in MODULES:
                missing.append(f"{module}: module {node.module} does not exist")
                continue
            names, lazy = definitions[node.module]
            for alias in node.names:
                if (
                    alias.name != "*"
                    and alias.name not in names
                    and f"{node.module}.{alias.name}" not in MODULES
                    and not lazy
                ):
                    missing.append(f"{module}: {node.module} has no {alias.name}")
    assert not missing, "\n".join(missing)
