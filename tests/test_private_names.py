"""No module imports another package's private names (issue 44, item 5).

A leading underscore says "not part of this package's surface": `engine.nn._base`,
`engine.tensor._jit_kernels`, `engine.tensor.trace._flat_tensors`. Inside its own package a private
name is shared freely; from outside, it is a hidden dependency that a refactor of that package
breaks without a word. This test reads every module of engine/, widgets/ and app/ with `ast`
(every import, module level or inside a function; relative imports resolved) and fails when one
takes a `_name` from outside its own package, as a module (`import engine.nn._base`,
`from engine.nn import _ops`), as a name (`from engine.tensor.trace import _flat_tensors`) or as
an attribute of a module it imported (`from engine.tensor import jit` ... `jit._kernel`).
`test_no_private_name_of_another_package_is_used[attributes]` does the same for the objects a module is
handed: `param._lazy` in engine.models reads a slot only engine.module defines.

A module's *own package* is the room the architecture notes draw: each subpackage of the engine
(`engine.nn`, `engine.models`, `engine.store`, ...; the modules right under `engine/` are the
package `engine`), and `widgets` and `app` as wholes (`app.core` is part of `app`). Dunder names
(`__version__`) are public."""
import ast
import functools
from pathlib import Path

import pytest

from tests.source_modules import PACKAGES, ROOT, imported_from, module_name


# Private names taken across packages that are tolerated for now, each "importer -> target.name"
# with a comment naming the debt; remove an entry when its import is gone
# (test_known_exceptions_still_exist says so).
KNOWN: set[str] = set()  # none left: an entry here is a debt with a comment naming it


def own_package(module: str) -> str:
    """`engine.nn._ops` -> `engine.nn`; `engine.hub` (a module right under engine) -> `engine`;
    `app.core.edits` -> `app`; `widgets.training.run_controls` -> `widgets`."""
    parts = module.split(".")
    if parts[0] == "engine" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


@functools.lru_cache(maxsize=4)
def parsed(packages=PACKAGES, root: Path = ROOT) -> dict[str, tuple[Path, ast.Module]]:
    """{module name: (its file, its syntax tree)}, read once for all the tests."""
    return {module_name(p, root): (p, ast.parse(p.read_text(encoding="utf-8"), filename=str(p)))
            for package in packages for p in sorted((root / package).rglob("*.py"))}


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_imports(packages=PACKAGES, root: Path = ROOT):
    """Yield `(importer, "target.name", where)` for each private name a module takes from outside
    its own package."""
    files = parsed(packages, root)
    for name, (path, tree) in files.items():
        is_package = path.name == "__init__.py"
        mine = own_package(name)
        modules: dict[str, str] = {}  # local name -> module of ours it is bound to

        def check(dotted: str, node: ast.AST):
            """`dotted` is a module path, possibly ending in a name taken from it: the first private
            part, and the package of what precedes it, decide."""
            parts = dotted.split(".")
            for i, part in enumerate(parts):
                if i and _private(part):
                    owner = ".".join(parts[:i])
                    if parts[0] in packages and own_package(owner) != mine:
                        return (name, ".".join(parts[:i + 1]), f"{path.relative_to(root).as_posix()}:{node.lineno}")
                    return None
            return None

        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.append(check(alias.name, node))
                    if alias.asname:
                        modules[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                module = imported_from(node, name, is_package)
                for alias in node.names:
                    found.append(check(f"{module}.{alias.name}", node))
                    if f"{module}.{alias.name}" in files:
                        modules[alias.asname or alias.name] = f"{module}.{alias.name}"
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in modules and _private(node.attr)):
                found.append(check(f"{modules[node.value.id]}.{node.attr}", node))
        seen = set()
        for item in found:
            if item and item[:2] not in seen:
                seen.add(item[:2])
                yield item


# Private attributes read across packages (`importer -> ._name`) tolerated for now, as above.
KNOWN_ATTRIBUTES: set[str] = set()  # none left


def private_attributes(packages=PACKAGES, root: Path = ROOT):
    """Yield `(reader, "._name", where)` for each `obj._name` a module reads (obj not `self` or
    `cls`) where `_name` is defined (a def, a class, an assignment, `x._name = ...`) only in
    other packages: a private attribute of another package's object."""
    trees = parsed(packages, root)
    defined: dict[str, set[str]] = {}
    for name, (_, tree) in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                found = node.attr
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found = node.id
            else:
                continue
            if _private(found):
                defined.setdefault(found, set()).add(own_package(name))
    for name, (path, tree) in trees.items():
        mine, seen = own_package(name), set()
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _private(node.attr)
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    and node.attr in defined and mine not in defined[node.attr] and node.attr not in seen):
                seen.add(node.attr)
                yield name, f".{node.attr}", f"{path.relative_to(root).as_posix()}:{node.lineno}"


# each check: what it finds, the set of tolerated findings (and its name), what a finding is
CHECKS = {
    "imports": (private_imports, KNOWN, "KNOWN", "private names taken from another package"),
    "attributes": (private_attributes, KNOWN_ATTRIBUTES, "KNOWN_ATTRIBUTES",
                   "private attributes of another package's objects"),
}


@pytest.mark.parametrize("check", CHECKS)
def test_no_private_name_of_another_package_is_used(check):
    find, known, _, what = CHECKS[check]
    found = [f"{where}: {user} -> {target}" for user, target, where in find() if f"{user} -> {target}" not in known]
    assert not found, f"{what}:\n" + "\n".join(found)


@pytest.mark.parametrize("check", CHECKS)
def test_known_exceptions_still_exist(check):
    find, known, known_name, _ = CHECKS[check]
    now = {f"{user} -> {target}" for user, target, _ in find()}
    gone = sorted(known - now)
    assert not gone, f"these are gone: remove them from {known_name}: {gone}"


def test_the_check_sees_modules_names_attributes_and_relative_imports(tmp_path):
    for folder in ("engine/nn", "engine/models", "app/core"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    files = {
        "engine/__init__.py": "from .nn import _base as b\n",
        "engine/nn/__init__.py": "from ._base import shape\n__all__ = ['shape']\n",
        "engine/nn/_base.py": "def shape(): pass\ndef _helper(): pass\n",
        "engine/nn/linear.py": "from ._base import _helper\nfrom engine.nn import _base\n",
        "engine/models/__init__.py": "",
        "engine/models/llama.py": ("from engine.nn._base import shape\nfrom engine.nn import __all__\n"
                                   "def f():\n    from ..nn import _base\n    import engine.nn.linear as lin\n"
                                   "    return lin._helper\n"),
        "app/__init__.py": "", "app/core/__init__.py": "",
        "app/core/x.py": "from app.window import _size\n", "app/window.py": "def _size(): pass\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    found = {(importer, target) for importer, target, _ in private_imports(("engine", "app"), tmp_path)}
    assert found == {("engine", "engine.nn._base"), ("engine.models.llama", "engine.nn._base"),
                     ("engine.models.llama", "engine.nn.linear._helper")}
    found = {(reader, attr) for reader, attr, _ in private_attributes(("engine", "app"), tmp_path)}
    assert found == {("engine.models.llama", "._helper")}  # a module's attribute is an attribute too


def test_the_attribute_check_sees_another_packages_slots_not_its_own(tmp_path):
    for folder in ("engine/module", "engine/models"):
        (tmp_path / folder).mkdir(parents=True)
    files = {
        "engine/__init__.py": "", "engine/module/__init__.py": "", "engine/models/__init__.py": "",
        "engine/module/param.py": ("class Param:\n    def __init__(self):\n        self._lazy = None\n"
                                   "def peek(p):\n    return p._lazy\n"),
        "engine/models/save.py": ("def f(p, q):\n    self = p\n    return p._lazy, q._mine, self._lazy\n"
                                  "class Q:\n    _mine = 1\n"),
    }
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    found = {(reader, attr) for reader, attr, _ in private_attributes(("engine",), tmp_path)}
    assert found == {("engine.models.save", "._lazy")}
