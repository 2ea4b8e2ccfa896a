"""The Tensor: an array on a device, optionally part of an autodiff graph.

A tensor is immutable from the outside: every operation returns a new tensor. Operations
live in the `ops_*` files beside this one, each next to its backward rule, and are attached
to `Tensor` as methods with `@tensor_method`.

Autodiff state, as Burn has it:
- `is_autodiff()`: the tensor is associated with autodiff (Burn's Autodiff backend). Results
  of operations are autodiff when any input is.
- `is_require_grad()`: the tensor is a leaf that retains its gradient after backward.
- A tensor takes part in a graph when it has a node: a leaf that requires grad, or the
  result of an operation recorded from such tensors.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..autodiff import tape as _tape
from ..autodiff.tape import Node, is_recording
from . import dtype as _dt
from .device import Device, DeviceError, as_device


class TensorError(ValueError):
    """An operation got inputs it cannot use; the message names the op and what it found."""


class DTypeError(TensorError, TypeError):
    """An operation or a layer got a tensor of the wrong dtype: mixed float dtypes in a matmul,
    a convolution or a layer, an int tensor where a float one is needed, or the reverse.

    Both a `TensorError` and a `TypeError`; the message names the op or layer, the dtype it
    expected and the one it found, and how to convert."""


def tensor_method(fn=None, *, name: str | None = None):
    """Attach a function to Tensor as a method (used by the ops files)."""

    def attach(f):
        setattr(Tensor, name or f.__name__, f)
        return f

    return attach(fn) if fn is not None else attach


class Tensor:
    __slots__ = ("_data", "_device", "_node", "_ad", "__weakref__")

    # ------------------------------------------------------------------ construction
    def __init__(self, data, device=None, dtype=None):
        t = Tensor.from_data(data, device=device, dtype=dtype)
        self._data, self._device, self._node, self._ad = t._data, t._device, None, False

    @staticmethod
    def _wrap(data, device: Device, ad: bool = False, node: Node | None = None) -> "Tensor":
        t = object.__new__(Tensor)
        if data.ndim == 0 and isinstance(data, np.generic):
            data = np.asarray(data)
        t._data = data
        t._device = device
        t._node = node
        t._ad = ad
        return t

    @staticmethod
    def from_data(data, device=None, dtype=None) -> "Tensor":
        """A tensor holding `data` (nested lists, a NumPy/CuPy array, a scalar or a Tensor).

        Float data takes the device's default float dtype unless `dtype` is given, as Burn
        converts data into the backend's float element type; ints become int64, bools bool.
        """
        dev = as_device(device)
        if isinstance(data, Tensor):
            if dtype is None:
                dtype = data.dtype
            data = data._data
        if dtype is not None:
            dt = _dt.as_dtype(dtype)
            arr = dev.asarray(data, dtype=dt.np)
        else:
            arr = dev.asarray(data)
            k = arr.dtype.kind
            if k == "f":
                if arr.dtype != dev.default_float_dtype.np:
                    arr = arr.astype(dev.default_float_dtype.np)
            elif k in "iu":
                if arr.dtype not in (np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32, np.uint64):
                    arr = arr.astype(np.int64)
            elif k == "b":
                pass
            else:
                raise TensorError(f"Tensor.from_data: unsupported data of NumPy dtype {arr.dtype}")
        if arr.dtype.kind not in "fiub" or np.dtype(arr.dtype) not in _dt._BY_NP:
            raise TensorError(f"Tensor.from_data: unsupported dtype {arr.dtype}")
        return Tensor._wrap(arr, dev)

    @staticmethod
    def _creation_dtype(dev: Device, dtype):
        return dev.default_float_dtype if dtype is None else _dt.as_dtype(dtype)

    @staticmethod
    def zeros(shape, device=None, dtype=None) -> "Tensor":
        dev = as_device(device)
        with dev.context():
            return Tensor._wrap(dev.xp.zeros(_shape(shape), dtype=Tensor._creation_dtype(dev, dtype).np), dev)

    @staticmethod
    def ones(shape, device=None, dtype=None) -> "Tensor":
        dev = as_device(device)
        with dev.context():
            return Tensor._wrap(dev.xp.ones(_shape(shape), dtype=Tensor._creation_dtype(dev, dtype).np), dev)

    @staticmethod
    def full(shape, value, device=None, dtype=None) -> "Tensor":
        dev = as_device(device)
        if dtype is None:
            dtype = _dt.bool_ if isinstance(value, bool) else (_dt.int64 if isinstance(value, numbers.Integral) else None)
        with dev.context():
            return Tensor._wrap(dev.xp.full(_shape(shape), value, dtype=Tensor._creation_dtype(dev, dtype).np), dev)

    @staticmethod
    def arange(start, end=None, step=1, device=None, dtype=None) -> "Tensor":
        """Integers `start, start+step, ... < end` (int64 unless a dtype is given)."""
        dev = as_device(device)
        if end is None:
            start, end = 0, start
        dt = _dt.int64 if dtype is None else _dt.as_dtype(dtype)
        with dev.context():
            return Tensor._wrap(dev.xp.arange(start, end, step).astype(dt.np), dev)

    @staticmethod
    def random(shape, distribution="default", device=None, dtype=None) -> "Tensor":
        """Random values from the device's own generator.

        `distribution`: "default" (uniform on [0, 1)), a `Distribution`, or a tuple
        ("uniform", low, high), ("normal", mean, std), ("bernoulli", p).
        """
        from .random import Distribution

        dev = as_device(device)
        dist = Distribution.parse(distribution)
        dt = Tensor._creation_dtype(dev, dtype)
        with dev.context():
            arr = dist.sample(dev, _shape(shape), dt)
        return Tensor._wrap(arr, dev)

    def zeros_like(self) -> "Tensor":
        return Tensor._wrap(self._device.xp.zeros_like(self._data), self._device)

    def ones_like(self) -> "Tensor":
        return Tensor._wrap(self._device.xp.ones_like(self._data), self._device)

    def full_like(self, value) -> "Tensor":
        return Tensor._wrap(self._device.xp.full_like(self._data, value), self._device)

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    def dims(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def rank(self) -> int:
        return self._data.ndim

    ndim = rank

    @property
    def dtype(self) -> _dt.DType:
        return _dt._BY_NP[self._data.dtype]

    @property
    def kind(self) -> str:
        k = self._data.dtype.kind
        return "float" if k == "f" else ("bool" if k == "b" else "int")

    @property
    def device(self) -> Device:
        return self._device

    def numel(self) -> int:
        return int(self._data.size)

    def __len__(self) -> int:
        if self._data.ndim == 0:
            raise TypeError("len() of a rank-0 tensor")
        return self._data.shape[0]

    # ------------------------------------------------------------------ host access
    def numpy(self) -> np.ndarray:
        """A copy of the values as a NumPy array on the host."""
        d = self._data
        if isinstance(d, np.ndarray):
            return d.copy()
        return d.get()

    def item(self):
        if self._data.size != 1:
            raise TensorError(f"item(): expected a tensor with one element, got dims {list(self.shape)}")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        if self._data.size != 1:
            raise TensorError(
                f"the truth value of a tensor with dims {list(self.shape)} is ambiguous; use .any() or .all()"
            )
        return bool(self.item())

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), precision=4, separator=", ", threshold=64)
        extra = ", require_grad" if self.is_require_grad() else (", autodiff" if self._ad else "")
        return f"Tensor({body}, dims={list(self.shape)}, dtype={self.dtype}, device={self._device}{extra})"

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    __hash__ = object.__hash__

    # ------------------------------------------------------------------ autodiff state
    def is_autodiff(self) -> bool:
        return self._ad

    def autodiff(self) -> "Tensor":
        """The same values, associated with autodiff (no copy)."""
        if self._ad:
            return self
        return Tensor._wrap(self._data, self._device, True, self._node)

    def inner(self) -> "Tensor":
        """The same values without autodiff (Burn's `inner`): no graph, not autodiff."""
        return Tensor._wrap(self._data, self._device, False, None)

    def is_require_grad(self) -> bool:
        n = self._node
        return n is not None and n.leaf

    def is_tracked(self) -> bool:
        """True when operations on this tensor are recorded (a grad leaf or a recorded result)."""
        return self._node is not None

    def require_grad(self) -> "Tensor":
        """This tensor as a leaf whose gradient is retained: `x = x.require_grad()`.

        Like Burn's consuming method it returns the result and never changes `self` (or any
        clone or module sharing it). The result is autodiff-associated. A tensor computed by
        recorded operations must be detached first, as its gradient belongs to the graph that
        produced it.
        """
        return self.set_require_grad(True)

    def set_require_grad(self, flag: bool) -> "Tensor":
        """This tensor with gradient retention on or off (a new tensor over the same values;
        `self` is unchanged). A tensor already in the requested state is returned as it is."""
        n = self._node
        if flag:
            if n is not None and n.leaf:
                return self
            if self._data.dtype.kind != "f":
                raise TensorError(f"require_grad: only float tensors have gradients, this one is {self.dtype}")
            if n is not None:
                raise TensorError(
                    f"require_grad on the output of '{n.op}', which is part of a graph: call detach() first"
                )
            return Tensor._wrap(self._data, self._device, True, Node((), None, "leaf", leaf=True))
        if n is not None and n.leaf:
            return Tensor._wrap(self._data, self._device, self._ad, None)
        return self

    def detach(self) -> "Tensor":
        """The same values cut from the graph (no gradient flows through); autodiff kept."""
        return Tensor._wrap(self._data, self._device, self._ad, None)

    def backward(self, grad: "Tensor | None" = None):
        """Reverse pass from this tensor; returns `Gradients`. Releases the recorded graph."""
        if self._node is None:
            raise TensorError(
                "backward(): this tensor is not part of an autodiff graph; no input it was computed "
                "from requires grad (call require_grad() on a leaf, or model.train())"
            )
        xp = self._device.xp
        if grad is None:
            seed = xp.ones_like(self._data)
        else:
            if grad.shape != self.shape:
                raise TensorError(f"backward(): gradient dims {list(grad.shape)} differ from tensor dims {list(self.shape)}")
            seed = grad._data
        return _tape.backward(self._node, seed)

    def grad(self, grads) -> "Tensor | None":
        """This tensor's gradient in `grads` (on this tensor's device), or None."""
        n = self._node
        if n is None:
            return None
        arr = grads.of_node(n)
        if arr is None:
            return None
        return Tensor._wrap(arr, self._device)

    def grad_remove(self, grads) -> "Tensor | None":
        n = self._node
        if n is None:
            return None
        arr = grads.remove(n)
        return None if arr is None else Tensor._wrap(arr, self._device)


def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, numbers.Integral):
        return (int(shape),)
    try:
        dims = tuple(int(s) for s in shape)
    except TypeError:
        raise TensorError(f"expected a shape (a sequence of ints), got {shape!r}") from None
    if any(s < 0 for s in dims):
        raise TensorError(f"expected non-negative sizes, got shape {list(dims)}")
    return dims


# ---------------------------------------------------------------------- op helpers
def record(out, device: Device, inputs, rule, op: str) -> Tensor:
    """Wrap `out`; when any input takes part in a graph, record a node with `rule`.

    `rule(grad) -> tuple` gives one gradient (array or None) per input, in order.
    """
    if len(inputs) == 1:  # most ops: one input, no loops
        n = inputs[0]._node
        if n is not None and is_recording():
            return Tensor._wrap(out, device, True, Node((n,), rule, op))
        return Tensor._wrap(out, device, inputs[0]._ad)
    nodes = tuple([t._node for t in inputs])
    if is_recording() and nodes.count(None) < len(nodes):
        return Tensor._wrap(out, device, True, Node(nodes, rule, op))
    return Tensor._wrap(out, device, any(t._ad for t in inputs))


def check_same_device(op: str, a: Tensor, b: Tensor) -> None:
    if a._device is not b._device:
        raise DeviceError(
            f"{op}: tensors are on different devices: {a._device} (dims {list(a.shape)}) and "
            f"{b._device} (dims {list(b.shape)}); move one with to_device()"
        )


# below this many rows a leading-axes sum stays NumPy's own reduction
_LEAD_SUM_MIN_ROWS = 16


def sum_leading(g, k: int = 1):
    """`g.sum(axis=(0, ..., k - 1))`. For a C-contiguous float32 / float64 NumPy array of many
    rows, one BLAS matrix-vector product `ones @ g` instead: NumPy reduces over a leading axis
    row by row, 2-4x slower (measured on a [2048, 128] bias gradient: 61 vs 23 us; PyTorch 43).
    Both add each column's rows in one pass, so the error bound is the same."""
    if (isinstance(g, np.ndarray) and g.dtype.type in (np.float32, np.float64) and g.flags.c_contiguous
            and 0 < k < g.ndim):
        rows = math.prod(g.shape[:k])
        if rows >= _LEAD_SUM_MIN_ROWS:
            return (np.ones(rows, dtype=g.dtype) @ g.reshape(rows, -1)).reshape(g.shape[k:])
    return g.sum(axis=tuple(range(k)))


def unbroadcast(g, shape):
    """Sum a broadcast gradient back to an operand's shape."""
    gs = g.shape
    if gs == shape:
        return g
    if gs[1:] == shape:  # one leading axis broadcast, as for a bias: the common case
        return sum_leading(g, 1)
    extra = g.ndim - len(shape)
    if extra > 0:
        g = sum_leading(g, extra)
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def as_operand(a: Tensor, other, op: str):
    """Check `other` for a binary op: a Tensor on a's device, or a Python/NumPy scalar."""
    if isinstance(other, Tensor):
        if other._device is not a._device:
            check_same_device(op, a, other)
        return other
    if isinstance(other, (numbers.Number, np.generic)):
        if isinstance(other, np.floating):
            other = float(other)  # NumPy scalars are strong types under NEP 50; keep the tensor's dtype
        return other
    raise TypeError(f"{op}: expected a Tensor or a number, got {type(other).__name__}")


def dim_index(op: str, dim: int, rank: int) -> int:
    if not -rank <= dim < max(rank, 1):
        raise TensorError(f"{op}: dim {dim} is out of range for a tensor of rank {rank}")
    return dim % rank if rank else 0
