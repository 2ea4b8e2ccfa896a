"""The PEFT-style trainable-parameter summary (engine.module.summary)."""
import numpy as np
import pytest

from engine import Tensor, nn
from engine.module import Module, Param, ParamGroup
from engine.module.lora import Lora, QLora
from engine.module.summary import TrainableCounts, trainable_counts, trainable_summary


class Net(Module):
    def __init__(self, d_in=100, d_hidden=300, d_out=10):
        self.fc1 = nn.LinearConfig(d_input=d_in, d_output=d_hidden).init()
        self.fc2 = nn.LinearConfig(d_input=d_hidden, d_output=d_out).init()
        self.steps = Param(Tensor.from_data(np.array([1, 2, 3], np.int64)))


BASE = 100 * 300 + 300 + 300 * 10 + 10 + 3  # 33,313


def test_the_line_is_pefts_format():
    assert str(TrainableCounts(2048, 36618)) == "trainable params: 2,048 || all params: 36,618 || trainable%: 5.5929"
    assert str(TrainableCounts(0, 0)) == "trainable params: 0 || all params: 0 || trainable%: 0.0000"
    c = TrainableCounts(1, 3)
    assert c.frozen == 2 and c.percent == pytest.approx(100 / 3)


def test_plain_module_trains_every_float_parameter():
    c = trainable_counts(Net())
    assert c == TrainableCounts(BASE - 3, BASE)
    assert trainable_summary(Net()) == (
        f"trainable params: {BASE - 3:,} || all params: {BASE:,} || trainable%: {100 * (BASE - 3) / BASE:.4f}")


def test_frozen_module_and_validation():
    assert trainable_counts(Net().freeze()) == TrainableCounts(0, BASE)
    assert trainable_counts(Net().valid()) == TrainableCounts(BASE - 3, BASE)  # configured, kept by valid()
    partly = Net().freeze_group(ParamGroup.from_predicate("fc1"))
    assert trainable_counts(partly).trainable == 300 * 10 + 10


def test_lora_counts_factors_as_trainable_and_never_initializes():
    net = Net()
    tuned = net.apply_lora(Lora(8, 16.0))
    lora = 8 * (100 + 300) + 8 * (300 + 10)
    assert trainable_counts(tuned) == TrainableCounts(lora, BASE + lora)
    assert trainable_summary(tuned) == "trainable params: 5,680 || all params: 38,993 || trainable%: 14.5667"
    assert not tuned.fc1.bias.is_initialized()


def test_qlora_counts_packed_weights_by_their_element_count():
    tuned = Net().apply_qlora(QLora(Lora(8, 16.0)))
    lora = 8 * (100 + 300) + 8 * (300 + 10)
    assert trainable_counts(tuned) == TrainableCounts(lora, BASE + lora)
    # whereas the stored elements (bytes of codes, scale constants) differ from the logical count
    assert tuned.num_params() != BASE + lora


def test_refuses_a_non_module():
    with pytest.raises(TypeError, match="expects a Module, got int"):
        trainable_counts(3)


def test_model_stats_per_path_and_its_total_is_trainable_counts():
    from engine.module.summary import ModelStats

    net = Net().freeze_group(ParamGroup.from_predicate("fc1"))
    stats = ModelStats(net)
    assert stats.total.counts == trainable_counts(net)
    fc1, fc2 = stats.get("fc1"), stats.get("fc2")
    assert (fc1.numel, fc1.trainable, fc1.state) == (100 * 300 + 300, 0, "frozen")
    assert (fc2.trainable, fc2.state, fc2.tensors) == (300 * 10 + 10, "trainable", 2)
    assert stats.total.state == "partly" and stats.get("steps").floats == 0
    assert stats.get("no.such.path").numel == 0 and ModelStats(None).total.numel == 0
    assert (stats.total.tensors, stats.total.initialized) == (5, 1)  # the layers are lazy: nothing was read


def test_model_stats_counts_packed_weights_only_on_their_own_nodes():
    from engine.module.summary import ModelStats

    q = Net().apply_qlora(QLora(Lora(4, 8.0)))
    stats = ModelStats(q)
    assert stats.total.counts == trainable_counts(q)
    assert stats.get("fc1").reparameterized == 1 and stats.total.reparameterized == 2
    packed = [p for p in stats.by_path if p.endswith(".nf4")]
    assert packed and all(stats.get(p).numel > 0 for p in packed)
