"""The modules of engine/, widgets/ and app/ as the source-reading tests see them
(`test_import_cycles`, `test_private_names`): a file's dotted module name, and the module an
`ImportFrom` names, relative imports resolved."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "widgets", "app")


def module_name(path: Path, root: Path = ROOT) -> str:
    """`root/engine/nn/linear.py` -> `engine.nn.linear`; a package's `__init__.py` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_from(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The absolute module `from ... import` names in module `name` (a package's `__init__` when
    `is_package`): `from . import x` in `engine.nn.linear` -> `engine.nn`, `from ..tensor import t`
    -> `engine.tensor`."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))
