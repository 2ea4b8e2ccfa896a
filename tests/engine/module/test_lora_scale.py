"""The adapter scale (llama.cpp's `--lora-scaled`, issue 45 item 4): `scale_adapters(model, s)` is a model whose
LoRA deltas are `s` times their own; 0 gives the base model's logits, 1 the adapted model's, and the model
it was made from keeps its own adapters."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine import ParamGroup, Tensor
from engine.models import from_pretrained
from engine.module import Lora
from engine.module.lora import LoraAdapter, scale_adapters
from engine.module.param import Param
from engine.module.reparam import iter_param_slots

LLAMA = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "llama-gqa"
IDS = Tensor.from_data(np.array([[5, 9, 17, 3, 40, 22]], dtype=np.int64))


def _adapted():
    """The tiny Llama with rank-2 adapters on q and v whose factors are both non-zero (a trained look)."""
    base = from_pretrained(LLAMA)
    model = base.apply_lora(Lora(2, 4.0, param_group=_qv()))
    rng = np.random.default_rng(0)
    for path, p in list(iter_param_slots(model)):
        r = p.reparameterization
        if isinstance(r, LoraAdapter):
            b = Param.initialized(Tensor.from_data(rng.normal(0, 0.3, size=r.b.shape).astype(np.float32)))
            model = model.with_child(path, p.with_reparameterization(LoraAdapter(r.a, b, r.scale)))
    return base, model


def _qv():
    return ParamGroup.from_regex(r"self_attn\.(query|value)\.weight$")


def _weights(model) -> dict:
    """Every parameter's effective value (through its adapter), by path."""
    return {path: p.val().numpy() for path, p in iter_param_slots(model) if ".lora." not in path}


def _logits(model) -> np.ndarray:
    return model.valid().forward(IDS).numpy().astype(np.float64)


def test_scale_zero_is_the_base_and_scale_one_the_adapted_model():
    base, model = _adapted()
    off, on = _logits(model.detach_reparameterization()), _logits(model)
    assert np.abs(on - off).max() > 1e-2  # the adapters change the logits: the test can tell them apart
    zero = scale_adapters(model, 0.0)
    # scale 0: every effective weight is the base's, bit for bit ...
    weights, bases = _weights(zero), _weights(base)
    assert sorted(weights) == sorted(bases)
    for path, w in weights.items():
        np.testing.assert_array_equal(w, bases[path], err_msg=path)
    # ... and the logits the base's, up to float32 summation order (base + 0 is a new, C-ordered weight where the
    # folder's is a transposed view)
    np.testing.assert_allclose(_logits(zero), off, rtol=0, atol=1e-5)
    np.testing.assert_allclose(_logits(base), off, rtol=0, atol=1e-6)
    np.testing.assert_allclose(_logits(scale_adapters(model, 1.0)), on, rtol=0, atol=1e-6)
    half, double = _logits(scale_adapters(model, 0.5)), _logits(scale_adapters(model, 2.0))
    assert np.abs(half - off).max() > 1e-3 and np.abs(half - on).max() > 1e-3
    assert np.abs(double - on).max() > 1e-3


def test_the_model_it_was_made_from_is_unchanged():
    _base, model = _adapted()
    before = _logits(model)
    scales = {path: p.reparameterization.scale for path, p in iter_param_slots(model)
              if p.reparameterization is not None}
    scaled = scale_adapters(model, 0.25)
    got = {path: p.reparameterization.scale for path, p in iter_param_slots(scaled) if p.reparameterization is not None}
    assert sorted(got) == sorted(scales) and len(scales) == 4  # q and v of two layers
    assert all(got[k] == pytest.approx(0.25 * scales[k]) for k in scales)
    assert {path: p.reparameterization.scale for path, p in iter_param_slots(model)
            if p.reparameterization is not None} == scales
    np.testing.assert_array_equal(_logits(model), before)


def test_a_model_without_adapters_or_a_bad_scale_is_refused():
    base, model = _adapted()
    with pytest.raises(ValueError, match="expected a model with LoRA adapters"):
        scale_adapters(base, 0.5)
    for bad in (float("nan"), float("inf"), "1", True):
        with pytest.raises(ValueError, match="finite number"):
            scale_adapters(model, bad)
