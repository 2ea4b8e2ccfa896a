"""Moving tensors between devices, recorded by autodiff."""
from __future__ import annotations

from .device import Device
from .tensor import Tensor, record, tensor_method


@tensor_method
def to_device(self, device) -> Tensor:
    """This tensor on `device`. Recorded: the gradient flows back to this tensor on its own device.

    The values are copied when the device changes (devices never share memory); on the same
    device no copy is made, but a tracked tensor still records the transfer, as Burn does.
    """
    dst = Device(device)
    src = self._device
    if dst is src:
        out = self._data
    else:
        with dst.context():
            out = dst.asarray(self._data).copy() if dst.kind == "cpu" and src.kind == "cpu" else dst.asarray(self._data)
    return record(out, dst, (self,), lambda g: (src.asarray(g) if dst is not src else g,), "to_device")
