"""Visitors read every parameter of a module; mappers replace them.

Subclass and override what you need; every method has a do-nothing default. The traversal
calls `enter_module(name, container_type)` before each field, list element or dict entry it
descends into (parameters included: a parameter's own field name is entered before
`visit_float`), and `exit_module` after it, so a visitor can keep the current path:

    class Paths(ModuleVisitor):
        def __init__(self):
            self.stack, self.paths = [], []
        def enter_module(self, name, container_type):
            self.stack.append(name)
        def exit_module(self, name, container_type):
            self.stack.pop()
        def visit_float(self, param):
            self.paths.append(".".join(self.stack))

`container_type` is `"Struct:<ClassName>"` for a module's field, `"Vec"` for a list element,
`"Tuple"` for a tuple element, `"Map"` for a dict entry and `"Reparameterization"` when
entering a parameter's reparameterization. An absent optional child (None) is skipped.

Visitors and mappers see parameters and flags; to see the tree's structure (which fields are
modules, containers or constants) use `engine.module.tree`, the walk these are built on.
"""
from __future__ import annotations

__all__ = ["ModuleVisitor", "ModuleMapper"]


class ModuleVisitor:
    """Reads parameters: `module.visit(visitor)`."""

    def visit_float(self, param) -> None:
        """A float parameter (a `Param`; `param.val()` initializes it, `param.shape` does not)."""

    def visit_int(self, param) -> None:
        """An int parameter."""

    def visit_bool(self, param) -> None:
        """A bool parameter."""

    def visit_flag(self, flag) -> None:
        """A module-owned training flag (`engine.module.Flag`)."""

    def enter_module(self, name: str, container_type: str) -> None:
        """Called before descending into the field / element `name`."""

    def exit_module(self, name: str, container_type: str) -> None:
        """Called after leaving the field / element `name`."""


class ModuleMapper:
    """Replaces parameters: `new_module = module.map(mapper)`. Each `map_*` returns a `Param`."""

    def map_float(self, param):
        """Return the parameter to put in place of this float parameter."""
        return param

    def map_int(self, param):
        return param

    def map_bool(self, param):
        return param

    def map_flag(self, flag):
        """Return the training flag to put in place of this one."""
        return flag

    def enter_module(self, name: str, container_type: str) -> None:
        """Called before descending into the field / element `name`."""

    def exit_module(self, name: str, container_type: str) -> None:
        """Called after leaving the field / element `name`."""
