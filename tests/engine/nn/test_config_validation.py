"""Issue 18, item 9: a layer config's init() refuses sizes and counts that are not positive ints,
naming the config, the field and the value."""
import dataclasses
import inspect

import pytest

import engine.nn as nn
from engine.nn._base import NON_NEGATIVE_FIELDS, POSITIVE_FIELDS


def test_linear_refuses_a_negative_output_size():
    with pytest.raises(ValueError, match=r"LinearConfig\.d_output must be a positive int, got -3"):
        nn.LinearConfig(16, -3).init()
    assert nn.LinearConfig(16, 3).init().num_params() == 51


@pytest.mark.parametrize("make, message", [
    (lambda: nn.Conv2dConfig((1, 0), (3, 3)), r"Conv2dConfig\.channels must be a tuple of positive ints, got \(1, 0\)"),
    (lambda: nn.Conv1dConfig(1, 2, 3, stride=0), r"Conv1dConfig\.stride must be a positive int, got 0"),
    (lambda: nn.EmbeddingConfig(10, True), r"EmbeddingConfig\.d_model must be a positive int, got True"),
    (lambda: nn.MultiHeadAttentionConfig(8, -2), r"MultiHeadAttentionConfig\.n_heads must be a positive int"),
    (lambda: nn.LayerNormConfig(2.5), r"LayerNormConfig\.d_model must be a positive int, got 2\.5"),
    (lambda: nn.ConvTranspose1dConfig((1, 1), 3, padding=-1), r"ConvTranspose1dConfig\.padding must be an int >= 0"),
    (lambda: nn.TransformerEncoderConfig(8, 16, 2, 0), r"TransformerEncoderConfig\.n_layers must be a positive"),
])
def test_other_configs_name_the_field(make, message):
    with pytest.raises(ValueError, match=message):
        make().init()


def test_every_config_with_a_size_field_checks_it():
    """Each nn config with a size field, given -1 there, refuses it in init() by name."""
    checked = 0
    for name in dir(nn):
        cls = getattr(nn, name)
        if not (inspect.isclass(cls) and dataclasses.is_dataclass(cls) and hasattr(cls, "init")):
            continue
        for f in dataclasses.fields(cls):
            if f.name not in POSITIVE_FIELDS | NON_NEGATIVE_FIELDS:
                continue
            init = getattr(cls.init, "_checks_sizes", False)
            assert init, f"{name}.init does not check its sizes"
            checked += 1
    assert checked > 40
