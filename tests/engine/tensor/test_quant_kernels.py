"""The products with GGUF blocks (engine.tensor.cpu.quant, issue 46): decoded values bit for bit
the `gguf` package's, products equal to dequantize-then-multiply within float32 rounding (bounded
relative to the sum of the terms' magnitudes) at 1 and 2 kernel threads, the same bits at both,
None where there is no kernel; and a GGUF model's forward, backward and generation through them."""
from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from engine.tensor import Tensor  # noqa: E402
from engine.tensor.cpu import jit, quant, threads  # noqa: E402

needs_numba = pytest.mark.skipif(jit.kernels() is None, reason=f"compiled kernels unavailable: {jit.unavailable_reason()}")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gguf"
TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]
EPS = float(np.finfo(np.float32).eps)


def _maker():
    spec = importlib.util.spec_from_file_location("make_gguf_fixtures", FIXTURES / "make_gguf_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


maker = _maker()


def _blocks(qtype: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if qtype in maker.QUANTIZABLE:  # a real weight quantized by gguf
        return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32),
                                    gguf.GGMLQuantizationType[qtype])
    return maker.random_blocks(qtype, rows, cols, rng)


def _reference(blocks, qtype):
    return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype]).astype(np.float64)


def _assert_within_rounding(ours, a, b, terms: int):
    """|ours - a @ b| within float32 rounding of a sum of `terms` products: relative to the sum
    of the terms' magnitudes (|a| @ |b|), so cancellation does not make the bound meaningless."""
    exact = a.astype(np.float64) @ b
    scale = np.abs(a).astype(np.float64) @ np.abs(b)
    err = np.abs(ours.astype(np.float64) - exact)
    assert np.all(err <= 4 * terms * EPS * scale + 1e-30), float(np.max(err / (scale + 1e-30)))


@contextlib.contextmanager
def _threads(n):
    old = threads.num_threads()
    old_min = threads.PARALLEL_MIN_BYTES
    threads.set_num_threads(n)
    threads.PARALLEL_MIN_BYTES = 1  # hand every block to the threads even at these small sizes
    try:
        yield
    finally:
        threads.set_num_threads(old)
        threads.PARALLEL_MIN_BYTES = old_min


@needs_numba
@pytest.mark.parametrize("qtype", TYPES)
def test_decoded_values_are_the_gguf_packages_bit_for_bit(qtype):
    blocks = _blocks(qtype, 24, 512)
    ref = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype])
    ours = quant.dequantize(blocks, qtype, 512)
    assert np.isfinite(ref).all()
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
    rows = np.array([5, 0, 23, 5])
    assert np.array_equal(quant.dequantize(blocks, qtype, 512, rows).view(np.uint32), ref[rows].view(np.uint32))
    with pytest.raises(IndexError, match="row 24 is out of range for 24 rows"):
        quant.dequantize(blocks, qtype, 512, np.array([24]))


@needs_numba
@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 3, quant.MANY_ROWS + 1])
def test_products_equal_dequantize_then_multiply_at_one_and_two_threads(qtype, m):
    rows, k = 200, 512  # 200 rows: several row blocks and tiles, one cut short
    blocks = _blocks(qtype, rows, k, seed=1)
    ref = _reference(blocks, qtype)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((m, k)).astype(np.float32)
    g = rng.standard_normal((m, rows)).astype(np.float32)
    results = []
    old_tile = quant.TILE_BYTES
    quant.TILE_BYTES = 64 * k * 4  # several tiles
    try:
        for n in (1, 2):
            with _threads(n):
                y = quant.rows_product(x, blocks, qtype, k)
                gx = quant.product(g, blocks, qtype, k)
            assert y.shape == (m, rows) and gx.shape == (m, k)
            _assert_within_rounding(y, x, ref.T, k)
            _assert_within_rounding(gx, g, ref, rows)
            results.append((y, gx))
    finally:
        quant.TILE_BYTES = old_tile
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])


@needs_numba
def test_types_without_a_kernel_and_the_kernels_off_give_none():
    blocks = _blocks("Q5_0", 8, 64)
    x = np.ones((1, 64), dtype=np.float32)
    assert not quant.supported(blocks, "Q5_0", 64)
    assert quant.rows_product(x, blocks, "Q5_0", 64) is None
    q8 = _blocks("Q8_0", 8, 64)
    assert quant.rows_product(x, q8, "Q8_0", 32) is None  # rows that do not hold 32 values
    old = jit.set_enabled(False)
    try:
        assert quant.rows_product(x, q8, "Q8_0", 64) is None and quant.dequantize(q8, "Q8_0", 64) is None
    finally:
        jit.set_enabled(old)
    assert quant.rows_product(x, q8, "Q8_0", 64) is not None


# ---------------------------------------------------------------------------- through a GGUF model
MIXED = FIXTURES / "tiny-llama-mixed.gguf"
IDS = np.array([[1, 5, 7, 9, 42, 3, 250, 17]])


def _forward(model, ids=IDS):
    return model.forward(Tensor.from_data(ids, dtype="int64")).numpy()


@needs_numba
def test_a_gguf_models_logits_and_input_gradient_match_its_dequantized_weights():
    from engine.models import from_pretrained
    from engine.models.gguf_weight import dequantized_bases

    model = from_pretrained(MIXED)
    dense = dequantized_bases(model)
    ours, theirs = _forward(model), _forward(dense)
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5 * np.abs(theirs).max())

    # the gradient through a quantized Linear reaches its input (LoRA's training over the frozen base)
    layer = model.layers[0].mlp.gate_proj
    x = Tensor.from_data(np.random.default_rng(3).standard_normal((2, 5, layer.d_input)).astype(np.float32))
    x = x.autodiff().require_grad()
    w = dense.layers[0].mlp.gate_proj.weight.val().numpy()
    out = layer.forward(x)
    grads = out.sum().backward()
    np.testing.assert_allclose(out.numpy(), x.numpy() @ w, rtol=0, atol=1e-5 * np.abs(x.numpy() @ w).max())
    expected = np.ones((2, 5, w.shape[1]), dtype=np.float32) @ w.T
    np.testing.assert_allclose(x.grad(grads).numpy(), expected, rtol=0, atol=1e-5 * np.abs(expected).max())


@needs_numba
def test_lora_over_a_gguf_weight_multiplies_in_the_blocks_with_the_adapters_change():
    from engine.models import from_pretrained
    from engine.module.lora import Lora

    from engine.models.gguf_weight import GGUFLoraAdapter
    from engine.module import Param
    from engine.module.reparam import iter_param_slots

    model = from_pretrained(MIXED).apply_lora(Lora(4, 8.0))
    rng = np.random.default_rng(4)
    adapters = [p.reparameterization for _path, p in iter_param_slots(model)
                if isinstance(p.reparameterization, GGUFLoraAdapter)]
    assert adapters
    for r in adapters:  # B starts at zero: give the adapters a change to carry
        r.b = Param.initialized(Tensor.from_data((rng.standard_normal(tuple(r.b.shape)) * 0.02).astype(np.float32)))
    ours = _forward(model)
    # the same adapters, their values read whole (the value path every layer used before the kernels)
    old = jit.set_enabled(False)
    try:
        theirs = _forward(model)
    finally:
        jit.set_enabled(old)
    # two layers of float32 rounding, amplified by the norms and the attention: 1e-4 of the largest logit
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * np.abs(theirs).max())
    base = from_pretrained(MIXED)
    assert np.abs(ours - _forward(base)).max() > 100 * 1e-4 * np.abs(theirs).max()  # the adapters changed it


@needs_numba
def test_generation_keeps_the_weights_in_their_blocks():
    import importlib

    from engine.models import from_pretrained
    gen = importlib.import_module("engine.models.generate")
    from engine.models.gguf_weight import GGUFWeight
    from engine.module.reparam import iter_param_slots

    model = from_pretrained(MIXED)
    inference = gen._inference_model(model)
    kept = [p for _path, p in iter_param_slots(inference) if isinstance(p.reparameterization, GGUFWeight)]
    assert len(kept) == sum(isinstance(p.reparameterization, GGUFWeight) for _path, p in iter_param_slots(model)) > 0
    est = gen.estimate_generation(model, 1, 8, 4)
    assert est.parts["adapters folded into their weights"] == 0
    r = gen.generate(model, None, IDS[0].tolist(), 4, temperature=0, eos_token_id=[])
    old = jit.set_enabled(False)
    try:
        r_dense = gen.generate(model, None, IDS[0].tolist(), 4, temperature=0, eos_token_id=[])
    finally:
        jit.set_enabled(old)
    assert r.token_ids == r_dense.token_ids
