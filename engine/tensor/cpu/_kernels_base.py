"""What the compiled kernels (`_kernels`, `_kernels_conv`) share: their fastmath and compile
options and the array types of their signatures."""
from __future__ import annotations

import numpy as np
from numba import types

f32 = np.float32
_ELEMENTWISE = {"contract"}
_SUMS = {"contract", "reassoc"}
_OPTS = {"nogil": True, "cache": True, "error_model": "numpy", "boundscheck": False}

F1 = types.Array(types.float32, 1, "C")
F2 = types.Array(types.float32, 2, "C")
D1 = types.Array(types.float64, 1, "C")
R1 = types.Array(types.float32, 1, "C", readonly=True)  # inputs: read-only arrays match too (a
R2 = types.Array(types.float32, 2, "C", readonly=True)  # writable one converts to these types)
B2 = types.Array(types.boolean, 2, "C", readonly=True)
F3 = types.Array(types.float32, 3, "C")
R3 = types.Array(types.float32, 3, "C", readonly=True)
