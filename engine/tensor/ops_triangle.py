"""Triangles of the last two dims: `tril` / `triu` (with their backward rules) and Burn's
bool masks `tril_mask`, `triu_mask`, `diag_mask` for `mask_fill`."""
from __future__ import annotations

from .device import as_device
from .indices import _check_int, _desc
from .tensor import Tensor, TensorError, record, tensor_method


def _tri_keep(xp, rows, cols, diagonal, lower):
    r = xp.arange(rows).reshape(-1, 1)
    c = xp.arange(cols).reshape(1, -1)
    return (c - r <= diagonal) if lower else (c - r >= diagonal)


def _tri(self: Tensor, diagonal, lower: bool, op: str) -> Tensor:
    x = self._data
    if x.ndim < 2:
        raise TensorError(f"{op}: expected a tensor of rank >= 2, found {_desc(self)}")
    diagonal = _check_int(op, "diagonal", diagonal)
    xp = self._device.xp
    keep = _tri_keep(xp, x.shape[-2], x.shape[-1], diagonal, lower)
    out = xp.where(keep, x, xp.zeros((), dtype=x.dtype))

    def rule(g):
        return (xp.where(keep, g, xp.zeros((), dtype=g.dtype)),)

    return record(out, self._device, (self,), rule, op)


@tensor_method
def tril(self, diagonal=0) -> Tensor:
    """Keep the lower triangle of the last two dims (entries with col - row <= diagonal), zero the rest."""
    return _tri(self, diagonal, True, "tril")


@tensor_method
def triu(self, diagonal=0) -> Tensor:
    """Keep the upper triangle of the last two dims (entries with col - row >= diagonal), zero the rest."""
    return _tri(self, diagonal, False, "triu")


def _tri_mask(shape, offset, device, part: str) -> Tensor:
    from .tensor import _shape  # noqa: PLC0415

    dims = _shape(shape)
    op = f"{part}_mask"
    if len(dims) < 2:
        raise TensorError(f"{op}: expected a shape of rank >= 2, found {list(dims)}")
    offset = _check_int(op, "offset", offset)
    dev = as_device(device)
    xp = dev.xp
    with dev.context():
        r = xp.arange(dims[-2]).reshape(-1, 1)
        c = xp.arange(dims[-1]).reshape(1, -1)
        if part == "tril":
            m = c - r > offset
        elif part == "triu":
            m = c - r < offset
        else:
            m = c - r != offset
        m = xp.ascontiguousarray(xp.broadcast_to(m, dims))
    return Tensor._wrap(m, dev, False)


def tril_mask(shape, offset=0, device=None) -> Tensor:
    """Burn's `tril_mask`: a bool mask, True outside the lower triangle (col - row > offset), for mask_fill."""
    return _tri_mask(shape, offset, device, "tril")


def triu_mask(shape, offset=0, device=None) -> Tensor:
    """Burn's `triu_mask`: True outside the upper triangle (col - row < offset)."""
    return _tri_mask(shape, offset, device, "triu")


def diag_mask(shape, offset=0, device=None) -> Tensor:
    """Burn's `diag_mask`: True off the diagonal (col - row != offset)."""
    return _tri_mask(shape, offset, device, "diag")


Tensor.tril_mask = staticmethod(tril_mask)
Tensor.triu_mask = staticmethod(triu_mask)
Tensor.diag_mask = staticmethod(diag_mask)
