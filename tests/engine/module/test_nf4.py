"""NF4 packing, dequantization and double quantization (engine.module.nf4)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from engine.module.nf4 import (
    NF4_CODE,
    NF4Error,
    double_quantize,
    pack_nibbles,
    quantize_codes,
    quantize_nf4,
    unpack_nibbles,
)

# The code book as published with QLoRA (bitsandbytes' NF4 table), typed out independently.
PUBLISHED = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]


def test_code_book_is_the_published_one():
    np.testing.assert_array_equal(NF4_CODE, np.array(PUBLISHED, dtype=np.float32))
    assert np.all(np.diff(NF4_CODE) > 0)


def test_minus_one_and_one_pack_to_0x0f():
    p = quantize_nf4(np.array([-1.0, 1.0], dtype=np.float32), block_size=2)
    assert p.codes.dtype == np.uint8
    assert p.codes.tolist() == [0x0F]
    assert p.absmax.tolist() == [1.0]


def test_zeros_pack_to_0x77():
    p = quantize_nf4(np.zeros(2, dtype=np.float32), block_size=2)
    assert p.codes.tolist() == [0x77]
    np.testing.assert_array_equal(p.dequantize(), [0.0, 0.0])


def test_first_element_goes_to_the_high_nibble():
    codes = np.array([1, 2, 15, 0, 7, 8], dtype=np.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [0x12, 0xF0, 0x78]
    np.testing.assert_array_equal(unpack_nibbles(packed), codes)


def test_pack_rejects_odd_length():
    with pytest.raises(NF4Error, match="even length"):
        pack_nibbles(np.zeros(3, dtype=np.uint8))


def test_every_code_value_maps_to_its_own_index():
    assert quantize_codes(NF4_CODE).tolist() == list(range(16))


def test_code_lookup_equals_searchsorted_on_the_midpoints_at_every_edge():
    mid = ((NF4_CODE[:-1].astype(np.float64) + NF4_CODE[1:]) / 2).astype(np.float32)
    edges = np.concatenate([mid, np.nextafter(mid, np.float32(-2)), np.nextafter(mid, np.float32(2)),
                            NF4_CODE, np.linspace(-1, 1, 200_001, dtype=np.float32),
                            np.random.default_rng(9).uniform(-1, 1, 100_000).astype(np.float32)])
    expected = np.searchsorted(mid, edges, side="left")
    np.testing.assert_array_equal(quantize_codes(edges), expected)


@settings(max_examples=40, deadline=None)
@given(st.floats(-1.0, 1.0, allow_nan=False, width=32))
def test_nearest_code_is_chosen(x):
    idx = int(quantize_codes(np.array([x], dtype=np.float32))[0])
    dist = np.abs(NF4_CODE.astype(np.float64) - x)
    assert dist[idx] <= dist.min() + 1e-7


def test_absmax_is_per_block_of_consecutive_row_major_elements():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.02, size=(6, 40)).astype(np.float32)  # 240 elements: 3 full blocks + 48
    p = quantize_nf4(w, block_size=64)
    flat = w.reshape(-1)
    expected = [np.abs(flat[i:i + 64]).max() for i in range(0, 240, 64)]
    np.testing.assert_array_equal(p.absmax, np.array(expected, dtype=np.float32))
    assert p.codes.shape == (128,)  # 4 blocks * 64 codes / 2, last block zero-padded


def test_dequantized_equals_code_value_times_block_absmax():
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.02, size=(8, 24)).astype(np.float32)
    p = quantize_nf4(w, block_size=64)
    deq = p.dequantize()
    assert deq.shape == w.shape and deq.dtype == np.float32
    idx = p.code_indices()
    block = np.arange(w.size) // 64
    expected = NF4_CODE[idx] * p.absmax[block]
    np.testing.assert_array_equal(deq.reshape(-1), expected)
    # the element with the largest magnitude in each block is reproduced exactly
    flat = w.reshape(-1)
    for b in range(p.num_blocks):
        i = b * 64 + int(np.argmax(np.abs(flat[b * 64:(b + 1) * 64])))
        assert deq.reshape(-1)[i] == flat[i]


def test_nf4_error_on_gaussian_weights_is_as_published():
    # engine-notes: relative RMS error of NF4 on N(0, 0.02) weights is about 0.09
    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.02, size=(256, 256)).astype(np.float32)
    deq = quantize_nf4(w).dequantize()
    rel = np.sqrt(np.mean((deq - w) ** 2)) / np.sqrt(np.mean(w ** 2))
    assert 0.07 < rel < 0.11


@settings(max_examples=25, deadline=None)
@given(
    arrays(np.float32, st.integers(1, 300), elements=st.floats(-50, 50, width=32)),
    st.sampled_from([2, 8, 64]),
)
def test_dequantized_error_is_bounded_by_half_the_largest_code_gap(w, bs):
    p = quantize_nf4(w, block_size=bs)
    deq = p.dequantize()
    block = np.arange(w.size) // bs
    gap = np.max(np.diff(NF4_CODE)) / 2
    assert np.all(np.abs(deq - w) <= p.absmax[block] * gap * (1 + 1e-5) + 1e-30)


def test_double_quantization_storage_is_at_most_4_13_bits_per_weight():
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.02, size=(512, 256)).astype(np.float32)  # 2048 blocks = 8 absmax blocks
    plain = quantize_nf4(w, double_quant=False)
    dq = quantize_nf4(w, double_quant=True)
    assert plain.bits_per_weight == pytest.approx(4.5)
    assert dq.bits_per_weight <= 4.13
    assert dq.absmax is None
    assert dq.absmax_dq.values.dtype == np.int8
    assert dq.absmax_dq.scales.dtype == np.float32
    assert dq.absmax_dq.scales.shape == (8,)
    # the codes do not change; only the constants are approximated, and closely
    np.testing.assert_array_equal(dq.codes, plain.codes)
    np.testing.assert_allclose(dq.block_absmax(), plain.absmax, rtol=0, atol=np.ptp(plain.absmax) / 254 + 1e-9)
    rel = np.sqrt(np.mean((dq.dequantize() - plain.dequantize()) ** 2)) / np.sqrt(np.mean(w ** 2))
    assert rel < 0.01


def test_double_quantize_reconstructs_within_half_a_step():
    rng = np.random.default_rng(4)
    c = rng.uniform(0.01, 0.08, size=600).astype(np.float32)  # 3 blocks, the last partial
    d = double_quantize(c)
    assert d.values.shape == (600,) and d.scales.shape == (3,)
    assert d.mean == pytest.approx(float(c.mean()), rel=1e-6)
    rec = d.dequantize()
    block = np.arange(600) // 256
    assert np.all(np.abs(rec - c) <= d.scales[block] / 2 * (1 + 1e-4) + 1e-7)


def test_dequantized_with_double_quant_equals_code_value_times_stored_absmax():
    rng = np.random.default_rng(5)
    w = rng.normal(0, 1, size=(3, 64)).astype(np.float32)
    p = quantize_nf4(w, double_quant=True)
    expected = NF4_CODE[p.code_indices()] * p.block_absmax()[np.arange(w.size) // 64]
    np.testing.assert_allclose(p.dequantize().reshape(-1), expected, rtol=1e-6, atol=0)


def test_bad_inputs_are_refused_with_a_clear_message():
    with pytest.raises(NF4Error, match="positive even block size, got 3"):
        quantize_nf4(np.zeros(4, dtype=np.float32), block_size=3)
    with pytest.raises(NF4Error, match="float array, got dtype int64"):
        quantize_nf4(np.zeros(4, dtype=np.int64))
    with pytest.raises(NF4Error, match="NaN or infinite"):
        quantize_nf4(np.array([1.0, np.nan], dtype=np.float32))


def test_dtype_and_shape_round_trip():
    w = np.linspace(-1, 1, 30, dtype=np.float64).reshape(5, 6)
    p = quantize_nf4(w, block_size=4)
    out = p.dequantize()
    assert out.shape == (5, 6) and out.dtype == np.float64
    assert p.dequantize(np.float32).dtype == np.float32


def _cuda_available() -> bool:
    from engine.tensor.device import cuda_device_count

    return cuda_device_count() > 0


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_available(), reason="needs CuPy and a GPU")
def test_cupy_arrays_pack_exactly_like_numpy():
    import cupy

    rng = np.random.default_rng(6)
    w = rng.normal(0, 0.02, size=(300, 70)).astype(np.float32)
    for dq in (False, True):
        ref = quantize_nf4(w, double_quant=dq)
        got = quantize_nf4(cupy.asarray(w), double_quant=dq)
        assert isinstance(got.codes, cupy.ndarray)
        np.testing.assert_array_equal(got.codes.get(), ref.codes)
        np.testing.assert_array_equal(got.block_absmax().get(), ref.block_absmax())
        np.testing.assert_array_equal(got.dequantize().get(), ref.dequantize())
