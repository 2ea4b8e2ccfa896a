"""Tensors on NumPy (CPU) and CuPy (GPU), dtypes, devices and the operations."""
# the CPU door first: it makes its one OpenBLAS setting before anything here loads NumPy
from . import cpu  # noqa: F401
from . import dtype
from .device import Device, DeviceError, available_devices, default_device, set_default_device
from .random import Distribution
from .tensor import DTypeError, Tensor, TensorError, tensor_method

# each file attaches its operations to Tensor
from . import ops_elementwise, ops_reduce, ops_matmul, ops_shape, ops_device  # noqa: E402,F401
from . import ops_slice, ops_join, ops_gather, ops_pad, ops_triangle, ops_dropout  # noqa: E402,F401
from .ops_elementwise import where  # noqa: E402
from . import ops_conv, ops_pool, ops_interp  # noqa: E402,F401

__all__ = [
    "Tensor",
    "TensorError",
    "DTypeError",
    "Device",
    "DeviceError",
    "Distribution",
    "available_devices",
    "default_device",
    "set_default_device",
    "dtype",
    "tensor_method",
    "where",
]

from .indices import TensorIndexError  # noqa: E402
from .ops_join import cat, stack  # noqa: E402
from .ops_triangle import tril_mask, triu_mask, diag_mask  # noqa: E402
__all__ += ["TensorIndexError", "cat", "stack", "tril_mask", "triu_mask", "diag_mask"]
