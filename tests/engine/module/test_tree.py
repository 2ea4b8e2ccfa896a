"""engine.module.tree: field kinds, children, walk and find (the one module-tree walk)."""
from engine.module import Flag, Lora, Module, Param
from engine.module.tree import FieldKind, children, find, kind_of, walk
from engine.nn import LinearConfig
from engine.tensor import Tensor


class Block(Module):
    def __init__(self):
        self.weight = Param(Tensor.ones([2, 2]))
        self.size = 2
        self.norm = None


class Net(Module):
    def __init__(self):
        self.blocks = [Block(), Block()]
        self.table = {"t": Tensor.arange(3)}
        self.training = Flag(True)
        self.names = ["a", "b"]


def test_kinds():
    net = Net()
    assert kind_of(net) is FieldKind.MODULE
    assert kind_of(net.blocks) is FieldKind.CONTAINER
    assert kind_of(net.names) is FieldKind.PLAIN
    assert kind_of([None]) is FieldKind.PLAIN
    assert kind_of(None) is FieldKind.NONE
    assert kind_of(net.training) is FieldKind.FLAG
    assert kind_of(net.table["t"]) is FieldKind.CONSTANT
    assert kind_of(net.blocks[0].weight) is FieldKind.PARAM
    assert FieldKind.MODULE == "module"


def test_children_skip_plain_and_none():
    net = Net()
    assert [(n, k) for n, k, _ in children(net)] == [
        ("blocks", FieldKind.CONTAINER), ("table", FieldKind.CONTAINER), ("training", FieldKind.FLAG)]
    assert [n for n, _, _ in children(net.blocks[0])] == ["weight"]
    assert list(children(net.blocks[0].weight)) == []


def test_walk_paths_match_named_params():
    net = Net()
    params = [p for p, k, _ in walk(net) if k is FieldKind.PARAM]
    assert params == [p for p, _ in net.named_params()] == ["blocks.0.weight", "blocks.1.weight"]
    assert [p for p, _, _ in walk(net, prune=lambda v: v is net.blocks[1])][:3] == [
        "blocks", "blocks.0", "blocks.0.weight"]


def test_reparameterization_is_a_child_of_its_param():
    model = LinearConfig(3, 4).init().apply_lora(Lora(2, 4.0))
    kids = list(children(model.weight))
    assert [(n, k) for n, k, _ in kids] == [("lora", FieldKind.REPARAMETERIZATION)]
    assert [p for p, k, _ in walk(model) if k is FieldKind.PARAM] == [p for p, _ in model.named_params()]
    kind, value = find(model, "weight.lora")
    assert kind is FieldKind.REPARAMETERIZATION and value is kids[0][2]
    assert find(model, "") == (FieldKind.MODULE, model)
    assert find(model, "nope") is None
