"""Burn's module system: modules, parameters (lazy, with ids), groups, visitors and mappers,
display, shape contracts and initializers."""
from .param import Param, ParamId
from .flag import Flag
from .group import ParamGroup, ParamGroupError
from .visitor import ModuleVisitor, ModuleMapper
from .module import Module
from .display import Content, DisplaySettings, option, rust_debug, rust_display
from .shape import ShapeError, assert_shape, debug_assert_shape, set_debug_assertions
from .init import Initializer

__all__ = [
    "Content",
    "DisplaySettings",
    "Flag",
    "Initializer",
    "Module",
    "ModuleMapper",
    "ModuleVisitor",
    "Param",
    "ParamGroup",
    "ParamGroupError",
    "ParamId",
    "ShapeError",
    "assert_shape",
    "debug_assert_shape",
    "option",
    "rust_debug",
    "rust_display",
    "set_debug_assertions",
]
