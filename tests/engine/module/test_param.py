"""Param and ParamId: ids, construction, lazy initialization, trainability, map."""
import numpy as np
import pytest

from engine import Device, Param, Tensor, TensorError
from engine.module import ParamId

from .helpers import Counter


def test_param_id_shows_13_base32hex_chars_of_little_endian_bytes():
    assert str(ParamId(123456)) == "83h0200000000"
    assert str(ParamId(0)) == "0000000000000"
    assert ParamId.decode("83h0200000000") == ParamId(123456)
    assert ParamId(123456).val() == 123456


def test_param_ids_are_random_u64_and_round_trip():
    ids = {ParamId().val() for _ in range(200)}
    assert len(ids) == 200
    assert all(0 <= i < 2**64 for i in ids)
    for i in list(ids)[:20]:
        text = str(ParamId(i))
        assert len(text) == 13 and text == text.lower()
        assert ParamId.decode(text).val() == i


def test_param_id_rejects_out_of_range_values():
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        ParamId(-1)
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        ParamId(2**64)


def test_param_from_tensor_is_trainable_without_changing_the_tensor():
    t = Tensor.ones([2, 3])
    p = Param(t)
    assert p.is_require_grad() and p.val().is_autodiff()
    assert not t.is_require_grad() and not t.is_autodiff()  # the caller's tensor is untouched
    assert p.is_initialized()
    assert p.shape == (2, 3) and p.kind == "float"


def test_int_param_does_not_require_grad():
    p = Param(Tensor.arange(4))
    assert p.kind == "int" and not p.is_require_grad()
    with pytest.raises(TensorError, match="only float"):
        p.set_require_grad(True)


def test_uninitialized_param_answers_queries_without_initializing():
    init = Counter([4, 5])
    p = init.param(Device("cpu:1"))
    assert not p.is_initialized()
    assert p.shape == (4, 5) and p.lazy_shape() == (4, 5) and p.rank == 2 and p.numel() == 20
    assert p.lazy_device() is Device("cpu:1")
    assert p.is_require_grad() and p.kind == "float"
    str(p), repr(p)
    assert init.calls == 0
    v = p.val()
    assert init.calls == 1 and p.is_initialized()
    assert v.device is Device("cpu:1") and v.shape == (4, 5) and v.is_require_grad()
    assert p.val() is v and init.calls == 1


def test_clones_share_one_lazy_state_so_the_initializer_runs_once():
    init = Counter([3])
    p = init.param()
    c = p.clone()
    assert c.id == p.id
    a = c.val()
    b = p.val()
    assert init.calls == 1
    assert b is a  # the same leaf: gradients through one are the other's
    g = (a * 2.0).sum().backward()
    np.testing.assert_array_equal(p.val().grad(g).numpy(), [2.0, 2.0, 2.0])


def test_initializer_result_is_checked_against_the_declared_shape():
    p = Param.uninitialized(lambda d, rg: Tensor.zeros([2], device=d), None, True, [3])
    with pytest.raises(TensorError, match=r"dims \[2\], expected \[3\]"):
        p.val()


def test_set_require_grad_returns_a_new_param_and_keeps_the_receiver():
    p = Param(Tensor.ones([2]))
    q = p.set_require_grad(False)
    assert p.is_require_grad() and not q.is_require_grad()
    assert q.id == p.id
    assert q.val().is_autodiff()


def test_lazy_set_require_grad_is_applied_at_initialization():
    init = Counter([2])
    q = init.param().set_require_grad(False)
    assert not q.is_require_grad() and init.calls == 0
    assert not q.val().is_require_grad()


def test_map_keeps_id_and_configured_trainability():
    p = Param(Tensor.from_data([-2.0, 0.5, 3.0]))
    q = p.map(lambda t: t.clamp(-1.0, 1.0))
    assert q.id == p.id
    np.testing.assert_array_equal(q.val().numpy(), [-1.0, 0.5, 1.0])
    assert not q.is_require_grad()  # a clamp output is not a leaf
    assert q.is_active()  # ... but the configured trainability survives
    assert q.valid().train().is_require_grad()


def test_val_and_base_without_reparameterization_are_the_same_tensor():
    p = Param(Tensor.ones([2]))
    assert p.reparameterization is None
    assert p.val() is p.base()


def test_val_applies_a_reparameterization_to_the_base():
    class Scale:
        def apply(self, base):
            return base * 3.0

    p = Param(Tensor.ones([2])).with_reparameterization(Scale())
    np.testing.assert_array_equal(p.val().numpy(), [3.0, 3.0])
    np.testing.assert_array_equal(p.base().numpy(), [1.0, 1.0])
    assert p.without_reparameterization().reparameterization is None


def test_uninitialized_rejects_bad_arguments():
    with pytest.raises(TypeError, match="callable"):
        Param.uninitialized(3, None, True, [2])
    with pytest.raises(ValueError, match="kind"):
        Param.uninitialized(lambda d, r: None, None, True, [2], kind="complex")
    with pytest.raises(TypeError, match="Tensor"):
        Param([1.0, 2.0])


def test_concurrent_first_reads_initialize_once():
    import threading
    import time

    calls = []

    def slow(device, require_grad):
        calls.append(1)
        time.sleep(0.05)
        return Tensor.zeros([2], device=device).require_grad()

    p = Param.uninitialized(slow, None, True, [2])
    clones = [p.clone() for _ in range(4)]
    threads = [threading.Thread(target=c.val) for c in clones]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len({id(c.val()) for c in clones}) == 1


def test_lazy_state_is_one_token_until_the_parameter_initializes_itself():
    """`lazy_state()` tells whether a parameter still waits for the initializer it was made
    with (from_pretrained / save_pretrained compare it); reading it initializes nothing."""
    calls = []
    p = Param.uninitialized(lambda d, rg: calls.append(1) or Tensor.ones([2], device=d), None, True, [2])
    other = Param.uninitialized(lambda d, rg: Tensor.ones([2], device=d), None, True, [2])
    token = p.lazy_state()
    assert token is not None and token is p.lazy_state() and token is not other.lazy_state()
    assert calls == [] and not p.is_initialized()
    p.val()
    assert calls == [1] and p.lazy_state() is None
