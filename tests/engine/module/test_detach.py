"""Detaching a reparameterization is an edit of its own, and nesting is refused per parameter
(issue 18, item 5): LoRA on one layer, then another layer, then detach the first — every other
change (an unfreeze made after the attachment, the second adapters) stays."""
import numpy as np
import pytest

from engine import Device, Module, Tensor, nn
from engine.module import Lora, ParamGroup, QLora
from engine.module.reparam import ReparameterizationError


class Two(Module):
    def __init__(self):
        self.fc1 = nn.LinearConfig(8, 8).init()
        self.fc2 = nn.LinearConfig(8, 4).init()

    def forward(self, x):
        return self.fc2.forward(self.fc1.forward(x).relu())


def group(pattern):
    return ParamGroup.from_regex(pattern)


def test_lora_attaches_to_parameters_without_one_while_others_have_one():
    Device("cpu").seed(0)
    model = Two().apply_lora(Lora(2, 4.0, param_group=group(r"^fc1\.weight$")))
    both = model.apply_lora(Lora(2, 4.0, param_group=group(r"^fc2\.weight$")))
    kept, first = both.fc1.weight.reparameterization, model.fc1.weight.reparameterization  # kept as it was
    assert kept.a.id == first.a.id and np.array_equal(kept.a.val().numpy(), first.a.val().numpy())
    assert both.fc2.weight.reparameterization is not None
    assert both.fc1.weight.reparameterization.a.is_require_grad()  # the first factors stay trainable
    with pytest.raises(ReparameterizationError, match=r"cannot be nested.*'fc1\.weight' \(LoraAdapter\)"):
        both.apply_lora(Lora(2, 4.0, param_group=group(r"^fc1\.weight$")))


def test_detach_removes_only_the_selected_adapters_and_keeps_later_edits():
    Device("cpu").seed(1)
    base = Two()
    x = Tensor.random([3, 8], ("normal", 0.0, 1.0))
    lora = base.apply_lora(Lora(2, 4.0)).unfreeze_group(group(r"^fc2\.bias$"))  # an edit after attaching
    detached = lora.detach_reparameterization(group(r"^fc1\."))
    assert detached.fc1.weight.reparameterization is None
    kept = detached.fc2.weight.reparameterization
    assert kept is not None and kept.a.id == lora.fc2.weight.reparameterization.a.id
    assert detached.fc2.bias.is_require_grad()  # the later unfreeze is still there
    assert not detached.fc1.weight.is_require_grad()  # the base keeps LoRA's freezing
    np.testing.assert_array_equal(detached.fc1.weight.val().numpy(), base.fc1.weight.val().numpy())
    assert "fc1.weight.lora.a" not in [p for p, _ in detached.named_params()]
    everything = lora.detach_reparameterization()
    assert not any(p.reparameterization is not None for p in everything.params())
    np.testing.assert_allclose(everything.forward(x).numpy(), base.forward(x).numpy(), rtol=1e-6)


def test_detaching_qlora_gives_back_the_dequantized_base():
    Device("cpu").seed(2)
    base = Two()
    q = base.apply_qlora(QLora(Lora(2, 4.0)))
    plain = q.detach_reparameterization()
    w, w0 = plain.fc1.weight.val().numpy(), base.fc1.weight.val().numpy()
    assert plain.fc1.weight.reparameterization is None and w.shape == w0.shape
    assert np.sqrt(((w - w0) ** 2).mean()) / np.sqrt((w0 ** 2).mean()) < 0.15  # NF4's error, not zeros


def test_a_detach_that_would_change_nothing_is_refused():
    model = Two().apply_lora(Lora(2, 4.0, param_group=group(r"^fc1\.weight$")))
    with pytest.raises(ReparameterizationError, match="none of the selected parameters"):
        model.detach_reparameterization(group(r"^fc2\."))
    with pytest.raises(ReparameterizationError, match="none of the selected parameters"):
        Two().detach_reparameterization()
