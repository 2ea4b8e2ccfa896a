"""Shape operations that move no values: reshape, permute, transpose, flatten, squeeze, expand."""
from __future__ import annotations

from .tensor import Tensor, TensorError, dim_index, record, tensor_method, unbroadcast


def _view(self, out, op, back):
    return record(out, self._device, (self,), lambda g: (back(g),), op)


@tensor_method
def reshape(self, *shape):
    """New dims with the same number of elements; one axis may be -1 (inferred)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    dims = tuple(int(s) for s in shape)
    if sum(1 for s in dims if s == -1) > 1 or any(s < -1 for s in dims):
        raise TensorError(f"reshape: expected sizes >= 0 and at most one -1, got {list(dims)}")
    x = self._data
    known = 1
    for s in dims:
        if s != -1:
            known *= s
    if -1 in dims:
        if known == 0 or x.size % known:
            raise TensorError(f"reshape: cannot infer -1 in {list(dims)} from dims {list(x.shape)} ({x.size} elements)")
    elif known != x.size:
        raise TensorError(f"reshape: dims {list(x.shape)} ({x.size} elements) cannot become {list(dims)} ({known} elements)")
    src = x.shape
    return _view(self, x.reshape(dims), "reshape", lambda g: g.reshape(src))


@tensor_method
def permute(self, *axes):
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    n = self._data.ndim
    ax = tuple(dim_index("permute", int(a), n) for a in axes)
    if sorted(ax) != list(range(n)):
        raise TensorError(f"permute: expected a permutation of {list(range(n))}, got {list(axes)}")
    inv = [0] * n
    for i, a in enumerate(ax):
        inv[a] = i
    return _view(self, self._data.transpose(ax), "permute", lambda g: g.transpose(inv))


@tensor_method
def swap_dims(self, dim1, dim2):
    n = self._data.ndim
    d1, d2 = dim_index("swap_dims", dim1, n), dim_index("swap_dims", dim2, n)
    return _view(self, self._data.swapaxes(d1, d2), "swap_dims", lambda g: g.swapaxes(d1, d2))


@tensor_method
def transpose(self):
    """Swap the last two axes (Burn's `transpose`)."""
    if self._data.ndim < 2:
        raise TensorError(f"transpose: expected rank >= 2, got dims {list(self.shape)}")
    return self.swap_dims(-2, -1)


@tensor_method
def flatten(self, start_dim=0, end_dim=-1):
    """Merge axes start_dim..end_dim (inclusive) into one."""
    x = self._data
    n = x.ndim
    if n == 0:
        return self.reshape(1)
    s, e = dim_index("flatten", start_dim, n), dim_index("flatten", end_dim, n)
    if s > e:
        raise TensorError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for rank {n}")
    size = 1
    for d in x.shape[s : e + 1]:
        size *= d
    return self.reshape(x.shape[:s] + (size,) + x.shape[e + 1 :])


@tensor_method
def unsqueeze(self, dim=0):
    """Insert an axis of size 1 at `dim` (Burn's `unsqueeze_dim`); negative counts from the end."""
    n = self._data.ndim
    if not -(n + 1) <= dim <= n:
        raise TensorError(f"unsqueeze: dim {dim} is out of range for a tensor of rank {n}")
    d = dim % (n + 1)
    x = self._data
    return self.reshape(x.shape[:d] + (1,) + x.shape[d:])


Tensor.unsqueeze_dim = unsqueeze


@tensor_method
def squeeze(self, dim=None):
    """Remove axis `dim` (which must have size 1), or every size-1 axis when dim is None."""
    x = self._data
    if dim is None:
        return self.reshape(tuple(s for s in x.shape if s != 1))
    d = dim_index("squeeze", dim, x.ndim)
    if x.shape[d] != 1:
        raise TensorError(f"squeeze: axis {dim} has size {x.shape[d]}, expected 1 (dims {list(x.shape)})")
    return self.reshape(x.shape[:d] + x.shape[d + 1 :])


Tensor.squeeze_dim = squeeze


@tensor_method
def expand(self, *shape):
    """Broadcast to `shape` (-1 keeps an axis); new axes are added in front."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    x = self._data
    if len(shape) < x.ndim:
        raise TensorError(f"expand: cannot expand dims {list(x.shape)} to fewer axes {list(shape)}")
    lead = len(shape) - x.ndim
    for i in range(lead):
        if int(shape[i]) < 0:
            raise TensorError(f"expand: a new leading axis needs an explicit size, got {shape[i]} at axis {i} (dims {list(x.shape)} to {list(shape)})")
    target = tuple(x.shape[i - lead] if s == -1 and i >= lead else int(s) for i, s in enumerate(shape))
    for i, s in enumerate(x.shape):
        if s != 1 and s != target[i + lead]:
            raise TensorError(f"expand: axis {i} of size {s} cannot become {target[i + lead]} (dims {list(x.shape)} to {list(target)})")
    src = x.shape
    out = self._device.xp.broadcast_to(x, target)
    return _view(self, out, "expand", lambda g: unbroadcast(g, src))
