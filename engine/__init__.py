"""Ember's engine: tensors with autodiff on NumPy/CuPy and Burn's module system in Python.

No Qt anywhere below this package (an import-linter contract checks it).
"""
import os as _os
import sys as _sys

# After each call OpenBLAS's worker threads spin for 2**28 clock ticks (about a tenth of a
# second) before they sleep, holding the cores that the engine's own kernel threads
# (engine.tensor.threads: pooling, batch norm, the convolution copies) run on between BLAS
# calls; both then crawl. 2**20 ticks (a few tenths of a millisecond) keeps the workers awake
# across the short gaps of a run of matrix products, yet lets them sleep through the engine's
# kernels (measured on 2 cores: an MLP step is as fast as with 2**28, a conv net's step ~20 %
# faster; 2**4, sleeping at once, costs the MLP up to 10 %). OpenBLAS reads the setting when
# it loads, so this only takes effect when NumPy is imported after the engine; a value
# already in the environment wins.
if "numpy" not in _sys.modules:
    _os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")
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

from .tensor.threads import num_threads, set_num_threads  # noqa: E402
__all__ += ["num_threads", "set_num_threads"]

from .module import Module, Param, ParamGroup, ShapeError, assert_shape, debug_assert_shape, set_debug_assertions  # noqa: E402
__all__ += ["Module", "Param", "ParamGroup", "ShapeError", "assert_shape", "debug_assert_shape", "set_debug_assertions"]

from . import nn  # noqa: E402
__all__ += ["nn"]
