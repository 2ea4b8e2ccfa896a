"""Burn's module system: modules, parameters (lazy, with ids), groups, the tree walk
(`engine.module.tree`), visitors and mappers, display, shape contracts and initializers."""
from .param import Param, ParamId
from .flag import Flag
from .group import ParamGroup, ParamGroupError
from .visitor import ModuleVisitor, ModuleMapper
from .tree import FieldKind
from .module import Module
from .display import Content, DisplaySettings, option, rust_debug, rust_display
from .shape import ShapeError, assert_shape, debug_assert_shape, set_debug_assertions
from .init import Initializer
from .reparam import Reparameterization, ReparameterizationError, Reparameterizer
from .lora import Lora, LoraAdapter, NF4Weight, QLora, QLoraAdapter
from .summary import TrainableCounts, trainable_counts, trainable_summary

__all__ = [
    "Content",
    "DisplaySettings",
    "FieldKind",
    "Flag",
    "Initializer",
    "Lora",
    "LoraAdapter",
    "NF4Weight",
    "QLora",
    "QLoraAdapter",
    "Reparameterization",
    "ReparameterizationError",
    "Reparameterizer",
    "TrainableCounts",
    "trainable_counts",
    "trainable_summary",
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
