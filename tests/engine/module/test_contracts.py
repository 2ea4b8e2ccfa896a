"""Shape contracts: parsing, docstrings, named axes, and a checked run that stops at the first
failing module with the exact message and the shapes that flowed up to it."""
import pytest

from engine.module.contracts import (INSIDE, NOT_RUN, OK, VIOLATED, ContractSyntaxError, check, docstring_contract,
                           example_shape, parse_contract)
from engine import Tensor


def test_parse_round_trips_and_names_slots():
    c = parse_contract(" [batch, 784]->[batch, 10] ")
    assert str(c) == "[batch, 784] -> [batch, 10]"
    c = parse_contract("[b, s], [b, s] -> [b, s, d_model * 2]")
    assert [p.slots for p in c.inputs] == [("b", "s"), ("b", "s")]
    assert c.outputs[0].slots == ("b", "s", "d_model * 2")
    assert parse_contract("[.., _, 3] -> []").inputs[0].slots == ("..", "_", "3")


@pytest.mark.parametrize("text, message", [
    ("[batch, 784]", "expected 'inputs -> outputs'"),
    ("[a] -> [b] -> [c]", "expected one '->'"),
    ("batch -> [a]", "expected '\\[' to start a shape at column 1, found 'b'"),
    ("[a, b -> [a]", "has no closing"),
    ("[a,, b] -> [a]", "empty axis"),
    ("[.., a, ..] -> [a]", "'..' may appear once"),
    ("[a**2] -> [a]", "only names, integers"),
    ("[1.5] -> [a]", "non-integer constant"),
    ("-> [a]", "at least one input"),
])
def test_bad_contracts_say_what_was_expected(text, message):
    with pytest.raises(ContractSyntaxError, match=message):
        parse_contract(text)


class Block:
    """A block.

    Shapes:
        - input: `[batch, d_in]`
        - output: `[batch, d_out]`
    """

    def __init__(self, d_in, d_out, weight):
        self.d_in, self.d_out = d_in, d_out
        self.weight = weight

    def forward(self, x):
        return x @ self.weight


class Net:
    def __init__(self, blocks):
        self.blocks = blocks

    def forward(self, x):
        """Run the blocks.

        # Shapes
        - input: `[batch, ...]`
        - output: `[batch, 10]`
        """
        for b in self.blocks:
            x = b.forward(x)
        return x


def make_net(d_mid=20):
    return Net([Block(784, d_mid, Tensor.ones([784, d_mid])), Block(20, 10, Tensor.ones([d_mid, 10]))])


def tree(net):
    return [("", net)] + [(f"blocks.{i}", b) for i, b in enumerate(net.blocks)]


def contracts_of(net):
    return {p: docstring_contract(m) for p, m in tree(net) if docstring_contract(m)}


def test_docstring_contracts_of_forward_and_class():
    net = make_net()
    assert docstring_contract(net) == "[batch, ..] -> [batch, 10]"
    assert docstring_contract(net.blocks[0]) == "[batch, d_in] -> [batch, d_out]"
    assert docstring_contract(object()) is None


def test_example_shape_uses_module_attributes_and_a_default_batch():
    b = Block(784, 20, None)
    assert example_shape(parse_contract("[batch, d_in] -> [batch, d_out]"), b) == [[2, 784]]
    assert example_shape(parse_contract("[n, 3, n * 4] -> [n]"), b, default=5) == [[5, 3, 20]]


def test_a_good_run_marks_every_module_ok():
    net = make_net()
    r = check(net, [Tensor.ones([3, 784])], contracts_of(net), tree(net))
    assert r.ok and r.error == ""
    assert [r.status(p) for p, _ in tree(net)] == [OK, OK, OK]
    assert r.output_shapes == [(3, 10)]
    assert r.nodes["blocks.1"].inputs == [(3, 20)] and r.nodes["blocks.1"].outputs == [(3, 10)]


def test_the_first_failing_module_gets_the_message_and_the_flow_stops_there():
    net = make_net(d_mid=30)  # block 1 declares d_in 20 but receives 30
    r = check(net, [Tensor.ones([3, 784])], contracts_of(net), tree(net))
    assert not r.ok and r.failure.path == "blocks.1"
    assert r.error == "assert_shape(input, [batch, d_in]): axis 1 expected 20, got 30 (dims [3, 30])"
    assert r.status("blocks.1") == VIOLATED
    assert r.status("blocks.0") == OK
    assert r.status("") == INSIDE
    assert [n.path for n in r.flow] == ["", "blocks.0", "blocks.1"]
    assert "blocks.0 [Block]: [3, 784] -> [3, 30]  ok" in r.flow_text()


def test_an_edited_contract_overrides_the_docstring_and_names_bind_across_inputs_and_outputs():
    net = make_net()
    contracts = contracts_of(net) | {"blocks.0": "[batch, 784] -> [batch, batch]"}
    r = check(net, [Tensor.ones([3, 784])], contracts, tree(net))
    assert r.failure.path == "blocks.0"
    assert r.error == "assert_shape(output, [batch, batch]): axis 1 expected 3, got 20 (dims [3, 20])"
    assert r.status("blocks.1") == NOT_RUN


def test_a_wrong_rank_is_reported_as_such():
    net = make_net()
    r = check(net, [Tensor.ones([784])], contracts_of(net), tree(net))
    assert r.failure.path == "blocks.0"  # the model's [batch, ..] accepts rank 1; the block does not
    assert r.error == "assert_shape(input, [batch, d_in]): rank 2 expected, got 1 (dims [784])"
    r = check(net, [Tensor.ones([3, 784])], contracts_of(net) | {"": "[b, .., 784, 1] -> [b, 10]"}, tree(net))
    assert r.error == "assert_shape(input, [b, .., 784, 1]): rank at least 3 expected, got 2 (dims [3, 784])"


def test_an_error_inside_a_module_without_contract_is_caught_at_that_module():
    net = make_net()
    r = check(net, [Tensor.ones([3, 100])], {}, tree(net))
    assert r.failure.path == "blocks.0"
    assert r.error  # the tensor library's own message about the matmul
    assert r.status("") == INSIDE


def test_forward_is_restored_after_a_check():
    net = make_net()
    check(net, [Tensor.ones([3, 784])], contracts_of(net), tree(net))
    assert Block.__dict__["forward"].__name__ == "forward" and not hasattr(Block.__dict__["forward"], "__wrapped__")
    assert Net.__dict__["forward"].__doc__.startswith("Run the blocks")


class Twice:
    def __init__(self, block):
        self.block = block

    def forward(self, x):
        return self.block.forward(self.block.forward(x))


def test_a_module_called_twice_appears_twice_in_the_flow():
    b = Block(4, 4, Tensor.ones([4, 4]))
    t = Twice(b)
    r = check(t, [Tensor.ones([3, 4])], {}, [("", t), ("block", b)])
    assert [(c.path, c.inputs, c.outputs) for c in r.flow] == [
        ("", [(3, 4)], [(3, 4)]), ("block", [(3, 4)], [(3, 4)]), ("block", [(3, 4)], [(3, 4)])]
    r = check(t, [Tensor.ones([3, 4])], {"block": "[n, 4] -> [n, 4]"}, [("", t), ("block", b)])
    assert r.ok and r.status("block") == OK
