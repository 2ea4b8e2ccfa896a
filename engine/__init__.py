"""Ember's engine: tensors with autodiff on NumPy/CuPy and Burn's module system in Python.

No Qt anywhere below this package (an import-linter contract checks it).
"""
from .tensor import Device, DeviceError, Distribution, Tensor, TensorError, available_devices, dtype
from .autodiff import Gradients, GraphReleasedError, no_recording

__all__ = [
    "Device",
    "DeviceError",
    "Distribution",
    "Gradients",
    "GraphReleasedError",
    "Tensor",
    "TensorError",
    "available_devices",
    "dtype",
    "no_recording",
]

from .tensor import TensorIndexError, cat, stack  # noqa: E402
__all__ += ["TensorIndexError", "cat", "stack"]

from .module import Module, Param, ParamGroup, ShapeError, assert_shape, debug_assert_shape, set_debug_assertions  # noqa: E402
__all__ += ["Module", "Param", "ParamGroup", "ShapeError", "assert_shape", "debug_assert_shape", "set_debug_assertions"]

from . import nn  # noqa: E402
__all__ += ["nn"]
