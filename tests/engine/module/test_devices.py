"""Moving between devices: to_device vs fork, eager and lazy (module-system.md)."""
import numpy as np
import pytest

from engine import Device, Module, Param, Tensor, dtype

from .helpers import Counter, Linear

SRC = Device("cpu")
DST = Device("cpu:1")


class Holder(Module):
    def __init__(self, p, const=None):
        self.p = p
        self.table = Tensor.arange(3) if const is None else const


@pytest.fixture
def restore_dst():
    yield
    DST.set_default_float_dtype("float32")
    DST.seed(None)


def initialized(values=(1.0, 2.0, 3.0)):
    return Holder(Param(Tensor.from_data(list(values), device=SRC)))


def test_to_device_records_the_transfer_and_gradients_flow_to_the_source():
    model = initialized()
    moved = model.clone().to_device(DST)
    t = moved.p.val()
    assert t.device is DST and t.is_autodiff()
    assert not t.is_require_grad()  # not retained: an optimizer cannot update the moved param
    grads = (t * t).sum().backward()
    assert t.grad(grads) is None
    np.testing.assert_allclose(model.p.val().grad(grads).numpy(), [2.0, 4.0, 6.0])
    assert model.p.val().grad(grads).device is SRC
    assert moved.p.id == model.p.id


def test_to_device_on_the_same_device_still_records_the_transfer():
    model = initialized()
    moved = model.to_device(SRC)
    assert not moved.p.is_require_grad()
    grads = moved.p.val().sum().backward()
    np.testing.assert_allclose(model.p.val().grad(grads).numpy(), [1.0, 1.0, 1.0])


def test_fork_detaches_and_restores_gradient_retention():
    model = initialized()
    forked = model.fork(DST)
    t = forked.p.val()
    assert t.device is DST and t.is_require_grad()
    grads = (t * 3.0).sum().backward()
    np.testing.assert_allclose(t.grad(grads).numpy(), [3.0, 3.0, 3.0])
    assert model.p.val().grad(grads) is None  # independent of the source graph
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0, 3.0])


def test_fork_keeps_a_frozen_param_frozen():
    model = initialized().no_grad()
    assert not model.fork(DST).p.is_require_grad()


def test_transfers_leave_the_receiver_unchanged():
    model = initialized()
    before = model.p.val()
    model.to_device(DST)
    model.fork(DST)
    assert model.p.val() is before and before.device is SRC and before.is_require_grad()


def test_constants_move_with_the_module():
    model = initialized()
    assert model.fork(DST).table.device is DST
    assert model.to_device(DST).table.device is DST
    assert model.table.device is SRC
    assert model.devices() == [SRC]
    assert model.fork(DST).devices() == [DST]


@pytest.mark.parametrize("method", ["to_device", "fork"])
def test_lazy_param_without_clone_only_changes_where_it_will_be_initialized(method, restore_dst):
    init = Counter([50])
    model = Holder(init.param(SRC))
    moved = getattr(model, method)(DST)
    assert init.calls == 0 and not moved.p.is_initialized()
    assert moved.p.lazy_device() is DST and moved.devices() == [DST]
    t = moved.p.val()
    assert init.devices == [DST]  # initialized on the destination, no transfer
    assert t.device is DST and t.is_require_grad()  # a leaf: no transfer was recorded


def test_lazy_builtin_initializer_uses_destination_generator_and_dtype(restore_dst):
    DST.set_default_float_dtype("float64")
    model = Linear(6, 5, device=SRC)
    forked = model.fork(DST)
    DST.seed(1234)
    w = forked.weight.val()
    assert w.dtype == dtype.float64 and w.device is DST
    DST.seed(1234)
    expected = Linear(6, 5, device=DST).weight.val()
    np.testing.assert_array_equal(w.numpy(), expected.numpy())
    assert np.abs(w.numpy()).max() <= 1 / np.sqrt(6)  # KaimingUniform bound sqrt(3) * gain / sqrt(fan_in)


@pytest.mark.parametrize("method", ["to_device", "fork"])
@pytest.mark.parametrize("first", ["moved", "source"])
def test_lazy_param_with_a_live_receiver_stays_lazy_and_one_id_gives_one_value(method, first):
    """Python keeps the receiver alive (the app's undo history always does): a lazy move
    allocates nothing, and whichever Param is read first initializes for both."""
    init = Counter([4])
    model = Holder(init.param(SRC))
    moved = getattr(model, method)(DST)
    assert init.calls == 0 and not moved.p.is_initialized() and not model.p.is_initialized()
    assert moved.p.lazy_device() is DST and model.p.lazy_device() is SRC
    a, b = (moved.p.val(), model.p.val()) if first == "moved" else (model.p.val(), moved.p.val())
    assert init.calls == 1 and init.devices == [DST if first == "moved" else SRC]
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert moved.p.val().device is DST and model.p.val().device is SRC
    assert moved.p.id == model.p.id
    assert moved.p.is_require_grad() and model.p.is_require_grad()  # lazy: no transfer recorded
    assert moved.p.val()._data is not model.p.val()._data  # devices never share memory


def test_lazy_fork_of_a_live_model_reads_the_same_values_in_the_other_dtype(restore_dst):
    DST.set_default_float_dtype("float64")
    model = Linear(6, 5, device=SRC)
    forked = model.fork(DST)
    w_src = model.weight.val()  # the source reads first: float32 values drawn on SRC
    w_dst = forked.weight.val()
    assert w_src.dtype == dtype.float32 and w_dst.dtype == dtype.float64
    np.testing.assert_array_equal(w_dst.numpy(), w_src.numpy().astype(np.float64))


def test_to_device_of_a_read_parameter_records_the_transfer():
    init = Counter([4])
    model = Holder(init.param(SRC))
    model.p.val()  # initialized: the Burn rule for a shared, initialized state applies
    moved = model.to_device(DST)
    assert not moved.p.is_require_grad()
    grads = moved.p.val().sum().backward()
    np.testing.assert_array_equal(model.p.val().grad(grads).numpy(), np.ones(4))


def test_lazy_param_stays_lazy_once_the_clone_is_gone():
    init = Counter([4])
    model = Holder(init.param(SRC))
    clone = model.clone()
    del clone
    moved = model.fork(DST)
    assert init.calls == 0 and moved.p.lazy_device() is DST


def test_transfers_preserve_the_source_autodiff_association():
    model = initialized().valid()
    forked = model.fork(DST)
    assert not forked.p.val().is_autodiff() and not forked.p.is_require_grad()
    moved = model.to_device(DST)
    assert not moved.p.val().is_autodiff()
    # train().fork() enables autodiff, restores the configured state, independent params
    trained = model.train().fork(DST)
    t = trained.p.val()
    assert t.is_autodiff() and t.is_require_grad() and t.device is DST


def test_int_params_move_without_gradients():
    model = Holder(Param(Tensor.arange(3)))
    forked = model.fork(DST)
    assert forked.p.val().device is DST and forked.p.kind == "int"
    assert not forked.p.is_require_grad()
