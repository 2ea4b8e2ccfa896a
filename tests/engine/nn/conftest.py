import pytest

from engine import Device


@pytest.fixture
def dev64():
    """A CPU device whose default float dtype is float64, for finite-difference checks of
    layers built by their configs (parameters then start in float64 too)."""
    dev = Device("cpu:3")
    old = dev.default_float_dtype
    dev.set_default_float_dtype("float64")
    dev.seed(0)
    yield dev
    dev.set_default_float_dtype(old)
