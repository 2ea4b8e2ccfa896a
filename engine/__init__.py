"""Ember's engine: tensors with autodiff on NumPy/CuPy and Burn's module system in Python.

No Qt anywhere below this package (an import-linter contract checks it).
"""
import os as _os
import sys as _sys

# After each call OpenBLAS's worker threads spin for about 2**28 cycles (a tenth of a second)
# before they sleep, holding the cores that the engine's own kernel threads
# (engine.tensor.threads: pooling, batch norm, the convolution copies) run on between BLAS
# calls; both then crawl. A short timeout lets them sleep at once. OpenBLAS reads it when it
# loads, so this only takes effect when NumPy is imported after the engine; a value already
# in the environment wins.
if "numpy" not in _sys.modules:
    _os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
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
