"""No module-level import cycle in engine/, widgets/ or app/ (issue 44, item 5).

The graph is read from the source with `ast`: every import a module runs when it is imported
(at module level, in an `if` such as `if TYPE_CHECKING:`, a `try` or a class body; an import
inside a function runs later and is left out), relative imports resolved, `from package import
name` pointing at the submodule when `name` is one. A cycle makes the two rooms one: neither can
be read, tested or moved without the other (the controllers and `main_window.py` were one,
`commands.py` and `document.py` another)."""
import ast
from pathlib import Path

import networkx as nx

from tests.source_modules import PACKAGES, ROOT, imported_from, module_name


# Cycles known and being removed by other parts of the work: each entry is the sorted set of the
# modules of one strongly connected component, with a comment naming it. Remove an entry when its
# cycle is gone (test_known_exceptions_still_exist says so).
KNOWN_CYCLES: list[frozenset[str]] = []


def module_level_imports(tree: ast.Module):
    """The import statements run when the module is imported (not those inside functions)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        else:
            stack.extend(ast.iter_child_nodes(node))


def import_graph(packages=PACKAGES, root: Path = ROOT) -> nx.DiGraph:
    files = {module_name(p, root): p for package in packages for p in sorted((root / package).rglob("*.py"))}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in module_level_imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                module = imported_from(node, name, is_package)
                # `from package import submodule` imports the submodule; any other name, the module
                targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in files else module
                           for alias in node.names]
            for target in targets:
                # `import a.b.c` of a name that is not a module of ours: its nearest module that is
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph.add_edge(name, target)
    return graph


def cycles(graph: nx.DiGraph) -> list[frozenset[str]]:
    """The strongly connected components of more than one module: each holds at least one cycle."""
    return [frozenset(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]


def describe(graph: nx.DiGraph, component: frozenset[str]) -> str:
    cycle = next(nx.simple_cycles(graph.subgraph(component)))
    return f"{len(component)} modules ({', '.join(sorted(component))}), e.g. " + " -> ".join(cycle + cycle[:1])


def test_no_module_level_import_cycle():
    graph = import_graph()
    found = [c for c in cycles(graph) if c not in KNOWN_CYCLES]
    assert not found, "module-level import cycles:\n" + "\n".join(describe(graph, c) for c in found)


def test_known_exceptions_still_exist():
    graph = import_graph()
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles(graph)]
    assert not gone, f"these cycles are gone: remove them from KNOWN_CYCLES: {gone}"


def test_the_graph_sees_type_checking_and_relative_imports_not_function_bodies(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import c\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (pkg / "b.py").write_text("from .sub.c import thing\nclass B:\n    from pkg import a\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    from ..a import x\nimport pkg.b\n")
    graph = import_graph(("pkg",), tmp_path)
    assert set(graph.edges) == {("pkg.a", "pkg.b"), ("pkg.b", "pkg.sub.c"), ("pkg.b", "pkg.a"),
                                ("pkg.sub", "pkg.sub.c"), ("pkg.sub.c", "pkg.b")}
    assert cycles(graph) == [frozenset({"pkg.a", "pkg.b", "pkg.sub.c"})]
