"""Ember's engine: tensors with autodiff on NumPy/CuPy and Burn's module system in Python.

No Qt anywhere below this package (an import-linter contract checks it).
"""
# Importing the engine imports its CPU door first (engine.tensor.cpu), whose docstring lists
# what that does: one OpenBLAS setting when NumPy is not loaded yet, and nothing that starts.
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

from .tensor import DTypeError, TensorIndexError, cat, stack  # noqa: E402
__all__ += ["DTypeError", "TensorIndexError", "cat", "stack"]

from .tensor.cpu import num_threads, set_num_threads  # noqa: E402
__all__ += ["num_threads", "set_num_threads"]

from .module import Module, Param, ParamGroup, ShapeError, assert_shape, debug_assert_shape, set_debug_assertions  # noqa: E402
__all__ += ["Module", "Param", "ParamGroup", "ShapeError", "assert_shape", "debug_assert_shape", "set_debug_assertions"]

from . import nn  # noqa: E402
__all__ += ["nn"]
