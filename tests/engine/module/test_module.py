"""Module structure: fields, children, paths, constants, clone and the Methods of module-system.md."""
import enum
from collections import namedtuple

import numpy as np
import pytest

from engine import Device, Module, Param, Tensor
from engine.module import Flag, ModuleVisitor

from .helpers import Counter, Linear, Mlp


class Mode(enum.Enum):
    Valid = 1
    Same = 2


Pair = namedtuple("Pair", "left right")


class Block(Module):
    def __init__(self):
        self.norm = None  # an absent optional child
        self.linear = Linear(2, 2)
        self.scale = Param(Tensor.ones([2]))


class Everything(Module):
    def __init__(self):
        self.d_model = 2  # plain attributes in between children keep their order
        self.blocks = [Block(), Block()]
        self.pair = (Linear(2, 3, bias=False), Linear(3, 2, bias=False))
        self.heads = {"cls": Linear(2, 1), "reg": Linear(2, 1, bias=False)}
        self.table = Tensor.arange(5)  # a constant
        self.mode = Mode.Valid
        self.kernel = [3, 3]
        self.named = Pair(Param(Tensor.zeros([1])), None)
        self._cache = "private"


def test_fields_are_discovered_in_assignment_order():
    m = Everything()
    assert [name for name, _ in m.named_fields()] == [
        "d_model", "blocks", "pair", "heads", "table", "mode", "kernel", "named"]
    assert [name for name, _ in m.named_children()] == ["blocks", "pair", "heads", "table", "named"]


def test_param_paths_follow_burnpack_names():
    paths = [path for path, _ in Everything().named_params()]
    assert paths == [
        "blocks.0.linear.weight", "blocks.0.linear.bias", "blocks.0.scale",
        "blocks.1.linear.weight", "blocks.1.linear.bias", "blocks.1.scale",
        "pair.0.weight", "pair.1.weight",
        "heads.cls.weight", "heads.cls.bias", "heads.reg.weight",
        "named.0",  # tuple elements (namedtuples too) by index
    ]


def test_optional_child_adds_no_segment():
    class Opt(Module):
        def __init__(self, with_child):
            self.child = Linear(1, 1) if with_child else None

    assert [p for p, _ in Opt(True).named_params()] == ["child.weight", "child.bias"]
    assert Opt(False).named_params() == [] and Opt(False).num_params() == 0


def test_constants_are_not_parameters():
    m = Everything()
    assert m.num_params() == sum(p.numel() for _, p in m.named_params())
    assert all(not isinstance(p, Tensor) for _, p in m.named_params())
    assert m.clone().table is m.table  # recreated with the module, not a parameter
    assert not m.valid().table.is_autodiff()


def test_num_params_counts_every_parameter_element_without_initializing():
    init = Counter([7, 3])

    class M(Module):
        def __init__(self):
            self.w = init.param()
            self.idx = Param(Tensor.arange(4))

    assert M().num_params() == 25 and init.calls == 0


def test_transitions_rebuild_containers_and_keep_plain_attributes():
    m = Everything()
    for other in (m.clone(), m.valid(), m.train(), m.no_grad(), m.fork("cpu:1"), m.to_device("cpu")):
        assert type(other) is Everything and other is not m
        assert isinstance(other.blocks, list) and len(other.blocks) == 2
        assert isinstance(other.pair, tuple) and isinstance(other.named, Pair)
        assert set(other.heads) == {"cls", "reg"}
        assert other.mode is Mode.Valid and other.kernel == [3, 3] and other.kernel is not m.kernel
        assert other.d_model == 2 and other.blocks[0].norm is None
        assert other._cache == "private"
        assert [p.id for _, p in other.named_params()] == [p.id for _, p in m.named_params()]


def test_clone_shares_parameter_state():
    m = Mlp()
    c = m.clone()
    assert c is not m and c.linear1 is not m.linear1
    assert c.linear1.weight.val() is m.linear1.weight.val()
    y = c.forward(Tensor.ones([1, 3]))
    grads = y.sum().backward()
    assert m.linear1.weight.val().grad(grads) is not None  # one shared leaf


def test_assigning_a_field_replaces_it():
    m = Mlp()
    new = Param(Tensor.zeros([3, 4]))
    m.linear1.weight = new
    assert m.get_child("linear1.weight") is new
    m.linear2 = Linear(4, 7)
    assert m.linear2.d_output == 7 and m.num_params() == 16 + 35


def test_get_set_and_with_child_by_path():
    m = Everything()
    assert m.get_child("blocks.1.linear") is m.blocks[1].linear
    assert m.get_child("heads.cls.weight") is m.heads["cls"].weight
    assert m.get_child("pair.0") is m.pair[0]
    with pytest.raises(KeyError, match="no child 'nope'"):
        m.get_child("blocks.nope")
    replacement = Linear(2, 2)
    n = m.with_child("blocks.0.linear", replacement)
    assert n.blocks[0].linear is replacement and m.blocks[0].linear is not replacement
    assert n.blocks[1] is m.blocks[1]
    t = m.with_child("pair.1", Linear(3, 2))
    assert isinstance(t.pair, tuple) and t.pair[0] is m.pair[0] and t.pair[1] is not m.pair[1]
    m.set_child("heads.reg", replacement)
    assert m.heads["reg"] is replacement


def test_named_modules_walks_depth_first_with_paths():
    paths = [p for p, _ in Everything().named_modules()]
    assert paths == ["", "blocks.0", "blocks.0.linear", "blocks.1", "blocks.1.linear", "pair.0", "pair.1",
                     "heads.cls", "heads.reg"]
    assert all(isinstance(mod, Module) for mod in Everything().modules())


def test_devices_lists_each_device_once_without_initializing():
    init = Counter([2])

    class M(Module):
        def __init__(self):
            self.a = init.param(Device("cpu:2"))
            self.b = Param(Tensor.ones([1]))
            self.c = Param(Tensor.ones([1], device="cpu:2"))

    assert M().devices() == [Device("cpu:2"), Device("cpu")] and init.calls == 0


def test_visit_returns_the_visitor_and_map_a_new_module():
    class Count(ModuleVisitor):
        n = 0

        def visit_float(self, param):
            self.n += 1

    assert Mlp().visit(Count()).n == 4


def test_flags_have_paths_and_ids():
    m = Mlp()
    (path, flag), = m.named_flags()
    assert path == "dropout.training" and isinstance(flag, Flag)
    assert m.clone().named_flags()[0][1].id == flag.id


def test_receiver_is_unchanged_by_every_transition():
    m = Mlp()
    ids = [(p, p.val()) for _, p in m.named_params()]
    flag = m.dropout.training
    for fn in (lambda x: x.clone(), lambda x: x.valid(), lambda x: x.train(), lambda x: x.no_grad(),
               lambda x: x.freeze(), lambda x: x.unfreeze(), lambda x: x.set_require_grad(False),
               lambda x: x.fork("cpu:1"), lambda x: x.to_device("cpu:1")):
        out = fn(m)
        assert isinstance(out, Mlp)
        assert [(p, p.val()) for _, p in m.named_params()] == ids
        assert m.dropout.training is flag and flag.enabled
        for _, p in m.named_params():
            assert p.val().is_require_grad() and p.val().device is Device("cpu")


def test_copy_and_deepcopy():
    import copy

    m = Mlp()
    shallow = copy.copy(m.linear1.weight)
    assert shallow.val() is m.linear1.weight.val()
    deep = copy.deepcopy(m)
    assert [p.id for p in deep.params()] == [p.id for p in m.params()]
    w, w2 = m.linear1.weight.val(), deep.linear1.weight.val()
    assert w2 is not w and w2.is_require_grad()
    np.testing.assert_array_equal(w2.numpy(), w.numpy())
    grads = deep.forward(Tensor.ones([1, 3])).sum().backward()
    assert w.grad(grads) is None and w2.grad(grads) is not None
    init = Counter([2])

    class Lazy(Module):
        def __init__(self):
            self.p = init.param()

    lazy = copy.deepcopy(Lazy())
    assert init.calls == 0 and not lazy.p.is_initialized()
