"""Training and validation, gradient tracking vs training flags (module-system.md "Methods",
"Training and validation")."""
import numpy as np
import pytest

from engine import Module, Param, ParamGroup, Tensor
from engine.module import Flag

from .helpers import Counter, Mlp


def float_params(model):
    return [(path, p) for path, p in model.named_params() if p.kind == "float"]


def test_a_new_model_trains():
    model = Mlp()
    for _, p in float_params(model):
        assert p.is_require_grad() and p.is_autodiff()
    assert model.dropout.training


def test_valid_disables_autodiff_and_flags_and_train_restores_them():
    model = Mlp()
    valid = model.valid()
    for _, p in float_params(valid):
        assert not p.val().is_autodiff() and not p.val().is_require_grad()
    assert not valid.dropout.training
    back = valid.train()
    for _, p in float_params(back):
        assert p.val().is_autodiff() and p.val().is_require_grad()
    assert back.dropout.training
    # the receiver is unchanged by both transitions
    assert model.dropout.training and model.linear1.weight.is_require_grad()
    assert not valid.dropout.training


def test_valid_keeps_lazy_params_lazy():
    init = Counter([3])

    class M(Module):
        def __init__(self):
            self.p = init.param()

    valid = M().valid()
    assert init.calls == 0 and not valid.p.is_require_grad()
    assert not valid.p.val().is_autodiff()
    assert valid.train().p.val().is_require_grad()


def test_train_does_not_undo_no_grad():
    model = Mlp().no_grad()
    for _, p in float_params(model.valid().train()):
        assert p.val().is_autodiff() and not p.is_require_grad()
    assert model.valid().train().dropout.training  # no_grad leaves training flags alone


def test_train_does_not_undo_freeze():
    model = Mlp().freeze()
    assert not model.dropout.training
    back = model.valid().train()
    assert not back.dropout.training
    assert all(not p.is_require_grad() for _, p in float_params(back))


def test_unfreeze_restores_gradients_and_flags():
    model = Mlp().freeze().unfreeze()
    assert model.dropout.training
    assert all(p.is_require_grad() for _, p in float_params(model))


def test_no_grad_changes_only_float_parameters():
    class M(Module):
        def __init__(self):
            self.w = Param(Tensor.ones([2]))
            self.idx = Param(Tensor.arange(2))
            self.training = Flag(True)

    m = M()
    n = m.no_grad()
    assert not n.w.is_require_grad()
    assert n.idx.val() is m.idx.val()  # int parameter untouched
    assert n.training  # flags untouched


def test_set_require_grad_on_a_module_without_autodiff_applies_when_train_enables_it():
    model = Mlp().no_grad().valid()
    configured = model.set_require_grad(True)
    for _, p in float_params(configured):
        assert not p.val().is_autodiff() and not p.is_require_grad()  # cannot apply without autodiff
    for _, p in float_params(configured.train()):
        assert p.is_require_grad()
    # and the reverse: no_grad configured while in validation survives train()
    assert all(not p.is_require_grad() for _, p in float_params(Mlp().valid().no_grad().train()))


def test_param_setter_on_a_module_without_autodiff_only_configures():
    """Unlike Tensor.require_grad (which acts on the tensor now), the parameter setter keeps the
    module without autodiff and records the configuration for train()."""
    valid = Mlp().no_grad().valid()
    p = valid.linear1.weight.set_require_grad(True)
    assert not p.val().is_autodiff() and not p.is_require_grad() and p.is_active()
    assert p.train().is_require_grad()


def test_group_variants_apply_only_to_matched_values():
    model = Mlp()
    g = ParamGroup.from_predicate("linear1")
    m = model.no_grad_group(g)
    assert not m.linear1.weight.is_require_grad() and not m.linear1.bias.is_require_grad()
    assert m.linear2.weight.is_require_grad()
    m2 = m.set_require_grad_group(ParamGroup.from_path("linear1.bias"), True)
    assert m2.linear1.bias.is_require_grad() and not m2.linear1.weight.is_require_grad()

    frozen = model.freeze_group(ParamGroup.from_predicate("dropout"))
    assert not frozen.dropout.training
    assert frozen.linear1.weight.is_require_grad()
    frozen_all = model.freeze()
    thawed = frozen_all.unfreeze_group(ParamGroup.from_regex(r"^linear2\."))
    assert thawed.linear2.weight.is_require_grad() and not thawed.linear1.weight.is_require_grad()
    assert not thawed.dropout.training
    by_id = model.freeze_group(ParamGroup.from_ids([model.dropout.training.id]))
    assert not by_id.dropout.training and by_id.linear1.weight.is_require_grad()


def test_dropout_needs_the_flag_and_an_autodiff_input():
    model = Mlp()
    x = Tensor.ones([64, 4])
    d = model.dropout
    assert d.forward(x) is x  # a plain input: no dropout even in training
    dropped = d.forward(x.autodiff())
    assert (dropped.numpy() == 0).any()
    assert model.valid().dropout.forward(x.autodiff()) is not None
    np.testing.assert_array_equal(model.valid().dropout.forward(x.autodiff()).numpy(), x.numpy())
    # moving an input does not make it autodiff
    assert not x.to_device("cpu:1").is_autodiff()


def test_on_training_change_hook_is_called_with_the_new_state():
    seen = []

    class Noise(Module):
        def __init__(self):
            self.training = Flag(True)

        def on_training_change(self, enabled):
            seen.append(enabled)
            return self

    class M(Module):
        def __init__(self):
            self.noise = Noise()

    m = M()
    m.valid()
    m.train()
    m.freeze()
    m.unfreeze()
    m.clone()
    assert seen == [False, True, False, True]


def test_on_training_change_must_return_a_module():
    class Bad(Module):
        def on_training_change(self, enabled):
            return None

    with pytest.raises(TypeError, match="on_training_change must return a Module"):
        Bad().valid()


def test_param_tensors_report_state_through_is_autodiff_and_is_require_grad():
    model = Mlp()
    x = Tensor.ones([2, 3])
    y = model.valid().forward(x)
    assert not y.is_autodiff()
    y = model.forward(x)
    assert y.is_autodiff()
    grads = y.sum().backward()
    assert model.linear1.weight.val().grad(grads) is not None


def test_unfreeze_during_validation_takes_effect_at_train():
    model = Mlp().freeze().valid().unfreeze()
    assert not model.dropout.training  # still validating
    assert all(not p.is_require_grad() for _, p in float_params(model))
    back = model.train()
    assert back.dropout.training and all(p.is_require_grad() for _, p in float_params(back))
