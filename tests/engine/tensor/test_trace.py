"""Op-level tracing (engine.tensor.trace): what one forward records, and that nothing is paid
when no trace runs."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from engine import Module, Tensor, nn
from engine.nn import _ops
from engine.tensor import ops_elementwise, ops_matmul, ops_shape
from engine.tensor import trace as trace_mod
from engine.tensor.trace import TraceError, Tracer


def _x(*shape):
    return Tensor.from_data(np.random.default_rng(0).standard_normal(shape).astype(np.float32))


def test_ops_are_recorded_with_their_attributes_inputs_and_outputs():
    x = _x(2, 3, 4)
    w = _x(4, 5)
    with Tracer(names={id(w): "fc.weight"}) as tr:
        tr.input(x, "input")
        y = x.reshape(6, 4)
        z = (y @ w) * 2.0
        s = z.swap_dims(0, 1)[1:3, ::2]
        out = s.softmax(1)
        tr.output(out)
    t = tr.trace
    assert t.op_names() == ["reshape", "matmul", "mul", "swap_dims", "getitem", "softmax"]
    reshape, matmul, mul, swap, item, softmax = t.ops
    assert reshape.attrs == {"shape": (6, 4)} and reshape.input_names == ["self"]
    assert t.tensors[reshape.inputs[0]].source == "input"
    assert t.tensors[matmul.inputs[1]].source == "param" and t.tensors[matmul.inputs[1]].name == "fc.weight"
    assert mul.attrs == {"other": 2.0} and len(mul.inputs) == 1
    assert swap.attrs == {"dim1": 0, "dim2": 1}
    assert item.attrs == {"key": (slice(1, 3, None), slice(None, None, 2))}
    assert softmax.attrs == {"dim": 1}
    assert [t.tensors[i].shape for i in (matmul.outputs[0], item.outputs[0], softmax.outputs[0])] == [
        (6, 5), (2, 3), (2, 3)]
    assert t.tensors[softmax.outputs[0]].dtype == "float32"
    # each op reads what an earlier op wrote
    assert matmul.inputs[0] == reshape.outputs[0] and softmax.inputs[0] == item.outputs[0]
    assert t.outputs == softmax.outputs


def test_an_unknown_tensor_an_op_reads_is_a_constant():
    x = _x(3)
    c = Tensor.from_data([1.0, 2.0, 3.0])
    with Tracer() as tr:
        tr.input(x)
        tr.output(x + c)
    (add,) = tr.trace.ops
    const = tr.trace.tensors[add.inputs[1]]
    assert const.source == "const" and const.shape == (3,)
    assert tr.trace.values[const.id] is c


def test_a_fused_kernel_and_a_composite_op_are_one_op_each():
    layer = nn.LinearConfig(4, 3).init()
    x = _x(2, 4)
    with Tracer() as tr:
        tr.input(x)
        h = layer.forward(x)
        out = nn.Gelu().forward(h).log_softmax(1)
        tr.output(out)
    assert tr.trace.op_names() == ["linear", "gelu", "log_softmax"]
    lin = tr.trace.ops[0]
    assert lin.input_names == ["x", "weight", "bias"]


class Block(Module):
    def __init__(self):
        self.fc = nn.LinearConfig(4, 4).init()
        self.act = nn.Relu()

    def forward(self, x):
        return self.act.forward(self.fc.forward(x)) + x


def test_scopes_set_by_the_caller_are_recorded_on_each_op():
    block = Block()
    x = _x(2, 4)
    with Tracer() as tr:
        tr.input(x)
        tr.push_scope("", "Block")
        tr.push_scope("fc", "Linear")
        h = block.fc.forward(x)
        tr.pop_scope()
        h = h + x
        tr.pop_scope()
        tr.output(h)
    (lin, add) = tr.trace.ops
    assert (lin.scope, lin.scopes) == ("fc", ("", "fc"))
    assert (add.scope, add.scopes) == ("", ("",))
    assert tr.trace.modules == [("", "Block"), ("fc", "Linear")]
    assert [o.op for o in tr.trace.ops_in("fc")] == ["linear"]


def test_outputs_are_the_same_inside_and_outside_a_trace():
    block = Block()
    x = _x(3, 4)
    plain = block.forward(x).numpy()
    with Tracer() as tr:
        traced = block.forward(x).numpy()
    assert np.array_equal(plain, traced)
    assert tr.trace.op_names() == ["linear", "relu", "add"]


def test_tracing_off_costs_nothing_the_plain_methods_are_in_place():
    originals = (Tensor.add, Tensor.__add__, Tensor.matmul, Tensor.reshape, _ops.linear, Tensor.cat)
    assert Tensor.add is ops_elementwise.add and Tensor.matmul is ops_matmul.matmul
    assert Tensor.reshape is ops_shape.reshape
    block = Block()
    x = _x(2, 4)
    before = trace_mod.hook_calls
    block.forward(x)
    assert trace_mod.hook_calls == before  # no wrapper ran
    with Tracer():
        assert Tensor.add is not ops_elementwise.add and trace_mod.is_active()
        block.forward(x)
    assert trace_mod.hook_calls == before + 3  # linear, relu, add: nothing inside them
    assert (Tensor.add, Tensor.__add__, Tensor.matmul, Tensor.reshape, _ops.linear, Tensor.cat) == originals
    assert not trace_mod.is_active()
    block.forward(x)
    assert trace_mod.hook_calls == before + 3


def test_methods_are_restored_when_the_traced_code_raises():
    with pytest.raises(ValueError):
        with Tracer():
            raise ValueError("boom")
    assert Tensor.add is ops_elementwise.add and not trace_mod.is_active()


def test_traces_do_not_nest_and_other_threads_are_not_recorded():
    x = _x(2)
    with Tracer() as tr:
        with pytest.raises(TraceError, match="already recording"):
            Tracer().__enter__()
        t = threading.Thread(target=lambda: (x + 1.0) * 3.0)
        t.start()
        t.join()
        x.exp()
    assert tr.trace.op_names() == ["exp"]


def test_an_output_without_tensors_is_an_error():
    with Tracer() as tr:
        with pytest.raises(TraceError, match="returned no tensor"):
            tr.output(3)


def test_a_registration_that_cannot_be_installed_leaves_every_method_plain(monkeypatch):
    class Owner:
        pass

    monkeypatch.setattr(trace_mod, "_registered", trace_mod._registered + [(Owner, "missing", "missing")])
    with pytest.raises(AttributeError):
        Tracer().__enter__()
    assert Tensor.add is ops_elementwise.add and Tensor.reshape is ops_shape.reshape
    assert not trace_mod.is_active()
