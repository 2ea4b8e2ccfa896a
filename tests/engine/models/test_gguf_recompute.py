"""The tape of a fine-tune over GGUF weights keeps their blocks, not float copies (issue 46): every
dequantized weight is freed when the forward is done with it and computed again in the backward,
and the gradients are those of the same fine-tune over the dequantized (float32) weights."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

pytest.importorskip("gguf")

from engine import optim  # noqa: E402
from engine.models import from_pretrained  # noqa: E402
from engine.models import gguf_weight  # noqa: E402
from engine.models.gguf_weight import GGUFLoraAdapter, GGUFWeight, dequantized_bases  # noqa: E402
from engine.module import Lora, Param, ParamGroup  # noqa: E402
from engine.module.tree import params as tree_params  # noqa: E402
from engine.tensor import Tensor  # noqa: E402
from tests.engine.models.test_gguf import IDS, MIXED  # noqa: E402


def _tuned(model, dora=False):
    """`model` with LoRA on q and v whose factors are both non-zero (as after training)."""
    out = model.apply_lora(Lora(2, 4.0, use_dora=dora,
                                param_group=ParamGroup.from_regex(r"self_attn\.(query|value)\.weight$")))
    rng = np.random.default_rng(4)
    for _, p in tree_params(out):
        r = p.reparameterization
        if hasattr(r, "b") and hasattr(r, "a"):
            r.a = Param(Tensor.from_data((rng.standard_normal(r.a.shape) * 0.1).astype(np.float32)), require_grad=True)
            r.b = Param(Tensor.from_data((rng.standard_normal(r.b.shape) * 0.1).astype(np.float32)), require_grad=True)
    return out


def _loss(model):
    m = model.train()
    out = m.forward(Tensor.from_data(IDS, dtype="int64"))
    return m, (out * out).mean()


def _grads(model) -> dict:
    m, loss = _loss(model)
    grads = optim.GradientsParams.from_grads(loss.backward(), m)
    return {path: grads.get(p.id).numpy() for path, p in tree_params(m) if p.is_require_grad()}


def _value_path(monkeypatch):
    """The weights read as values (what a type without a compiled kernel, a GPU or DoRA does)."""
    for cls in (GGUFWeight, GGUFLoraAdapter):
        monkeypatch.setattr(cls, "MULTIPLIES", False)


def test_the_forward_frees_every_dequantized_weight_and_the_backward_computes_them_again(monkeypatch):
    _value_path(monkeypatch)
    made = []
    real = gguf_weight.dequantize_blocks

    def counted(blocks, qtype):
        out = real(blocks, qtype)
        made.append(weakref.ref(out))
        return out

    monkeypatch.setattr(gguf_weight, "dequantize_blocks", counted)
    model = _tuned(from_pretrained(MIXED))
    gguf = [p for _, p in tree_params(model) if isinstance(p.reparameterization, (GGUFWeight, GGUFLoraAdapter))]
    assert any(isinstance(p.reparameterization, GGUFLoraAdapter) for p in gguf) and len(gguf) >= 10
    _m, loss = _loss(model)
    gc.collect()
    forward = len(made)
    assert forward >= len(gguf)
    alive = [r for r in made if r() is not None]
    assert alive == [], f"{len(alive)} of {forward} dequantized weights are kept by the graph until the backward"
    loss.backward()
    assert len(made) > forward  # the input gradients computed them again from the blocks


@pytest.mark.parametrize("dora", [False, True])
@pytest.mark.parametrize("values", [False, True])
def test_gradients_over_the_blocks_are_those_over_the_dequantized_weights(dora, values, monkeypatch):
    if values:
        _value_path(monkeypatch)
    quantized = _tuned(from_pretrained(MIXED), dora)
    dense = _tuned(dequantized_bases(from_pretrained(MIXED)), dora)
    ours, theirs = _grads(quantized), _grads(dense)
    assert sorted(ours) == sorted(theirs) and ours
    for path in ours:
        err = np.linalg.norm(ours[path] - theirs[path]) / np.linalg.norm(theirs[path])
        assert err <= (1e-6 if values else 1e-4), (path, err)  # the kernels round in their own order
        assert np.abs(ours[path]).max() > 0, path


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_dequantizing_in_slices_of_rows_gives_the_references_values(qtype, monkeypatch):
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[kind]
    monkeypatch.setattr(gguf_weight, "_CHUNK_BYTES", 1000)  # slices of a few rows, the last one shorter
    rows, per_row = 701, 8 * size  # 8 blocks of `block` values a row
    raw = np.random.default_rng(5).integers(0, 256, (rows, per_row), dtype=np.uint8)
    # finite scales: the f16 scale (and min) bytes of every block set to a small normal number
    view = raw.reshape(rows, 8, size)
    view[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    if qtype == "Q4_1":
        view[:, :, 2:4] = np.frombuffer(np.float16(-0.5).tobytes(), np.uint8)
    assert raw.nbytes > gguf_weight._CHUNK_BYTES
    want = gguf.quants.dequantize(raw, kind)
    got = gguf_weight.dequantize_blocks(raw, qtype)
    assert got.shape == want.shape == (rows, 8 * block) and np.array_equal(got, want)
