"""Visitor & Mapper (module-system.md): hooks, defaults, paths, the clamp mapper in both forms."""
import numpy as np
import pytest

from engine import Module, Param, Tensor
from engine.module import ModuleMapper, ModuleVisitor

from .helpers import Counter, Mlp


class Record(ModuleVisitor):
    def __init__(self):
        self.events = []
        self.stack = []

    def enter_module(self, name, container_type):
        self.stack.append(name)
        self.events.append(("enter", name, container_type))

    def exit_module(self, name, container_type):
        self.stack.pop()
        self.events.append(("exit", name, container_type))

    def visit_float(self, param):
        self.events.append(("float", ".".join(self.stack), param.id))

    def visit_int(self, param):
        self.events.append(("int", ".".join(self.stack), param.id))

    def visit_bool(self, param):
        self.events.append(("bool", ".".join(self.stack), param.id))


class Mixed(Module):
    def __init__(self):
        self.w = Param(Tensor.ones([2]))
        self.layers = [Module(), Mlp()]
        self.idx = Param(Tensor.arange(3))
        self.mask = Param(Tensor.from_data([True, False]))


def test_visitor_sees_each_kind_with_enter_exit_and_paths():
    m = Mixed()
    v = m.visit(Record())
    kinds = [(e[0], e[1]) for e in v.events if e[0] in ("float", "int", "bool")]
    assert kinds == [
        ("float", "w"),
        ("float", "layers.1.linear1.weight"), ("float", "layers.1.linear1.bias"),
        ("float", "layers.1.linear2.weight"), ("float", "layers.1.linear2.bias"),
        ("int", "idx"), ("bool", "mask"),
    ]
    assert v.events[0] == ("enter", "w", "Struct:Mixed")
    assert ("enter", "1", "Vec") in v.events and ("enter", "linear1", "Struct:Mlp") in v.events
    enters = sum(1 for e in v.events if e[0] == "enter")
    exits = sum(1 for e in v.events if e[0] == "exit")
    assert enters == exits and v.stack == []


def test_every_hook_has_a_do_nothing_default():
    class OnlyFloats(ModuleVisitor):
        def __init__(self):
            self.n = 0

        def visit_float(self, param):
            self.n += param.numel()

    assert Mixed().visit(OnlyFloats()).n == 2 + 26
    assert Mixed().visit(ModuleVisitor()) is not None
    m = Mixed()
    same = m.map(ModuleMapper())
    assert [(p, q.id) for p, q in same.named_params()] == [(p, q.id) for p, q in m.named_params()]


def test_visiting_does_not_initialize_unless_the_visitor_reads_values():
    init = Counter([3])

    class M(Module):
        def __init__(self):
            self.p = init.param()

    class Shapes(ModuleVisitor):
        shapes = []

        def visit_float(self, param):
            self.shapes.append(param.shape)

    assert M().visit(Shapes()).shapes == [(3,)] and init.calls == 0


def test_mapper_replaces_params_and_sees_paths():
    class Zero(ModuleMapper):
        def __init__(self):
            self.path, self.seen = [], []

        def enter_module(self, name, container_type):
            self.path.append(name)

        def exit_module(self, name, container_type):
            self.path.pop()

        def map_float(self, param):
            self.seen.append(".".join(self.path))
            return param.map(lambda t: t * 0.0)

    m = Mlp()
    z = Zero()
    out = m.map(z)
    assert z.seen == ["linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"]
    assert all((p.val().numpy() == 0).all() for _, p in out.named_params())
    assert all((p.val().numpy() != 0).any() for _, p in m.named_params())  # receiver unchanged
    assert [p.id for p in out.params()] == [p.id for p in m.params()]


def test_mapper_must_return_a_param():
    class Bad(ModuleMapper):
        def map_float(self, param):
            return param.val()

    with pytest.raises(TypeError, match=r"map_float must return a Param.*linear1.weight"):
        Mlp().map(Bad())


class Clamp(ModuleMapper):
    """The spec's first form: param.map(|tensor| tensor.clamp(min, max))."""

    def __init__(self, lo, hi):
        self.min, self.max = lo, hi

    def map_float(self, param):
        return param.map(lambda t: t.clamp(self.min, self.max))


class ClampLeaf(Clamp):
    """The spec's second form: detach after clamping, restore the retention setting."""

    def map_float(self, param):
        def fn(t):
            require_grad = t.is_require_grad()
            return t.clamp(self.min, self.max).detach().set_require_grad(require_grad)

        return param.map(fn)


def big_model():
    class M(Module):
        def __init__(self):
            self.w = Param(Tensor.from_data([[-3.0, -0.2], [0.4, 2.0]]))
            self.frozen = Param(Tensor.from_data([5.0, -5.0])).set_require_grad(False)

    return M()


@pytest.mark.parametrize("mapper", [Clamp(-0.5, 0.5), ClampLeaf(-0.5, 0.5)])
def test_clamp_mapper_clamps_every_float_parameter(mapper):
    m = big_model()
    out = m.map(mapper)
    np.testing.assert_allclose(out.w.val().numpy(), [[-0.5, -0.2], [0.4, 0.5]])
    np.testing.assert_allclose(out.frozen.val().numpy(), [0.5, -0.5])
    assert out.w.id == m.w.id


def test_clamp_first_form_leaves_a_graph_output_the_optimizer_cannot_update():
    out = big_model().map(Clamp(-0.5, 0.5))
    assert not out.w.is_require_grad()
    # Param.map kept the configured trainability: train() after valid() restores it
    assert out.valid().train().w.is_require_grad()
    assert not out.valid().train().frozen.is_require_grad()


def test_clamp_second_form_keeps_trainable_leaves():
    m = big_model()
    out = m.map(ClampLeaf(-0.5, 0.5))
    assert out.w.is_require_grad() and not out.frozen.is_require_grad()
    grads = (out.w.val() * 2.0).sum().backward()
    np.testing.assert_allclose(out.w.val().grad(grads).numpy(), np.full((2, 2), 2.0))
    assert m.w.val().grad(grads) is None  # cut from the original graph
