"""Shape contracts: assert_shape / debug_assert_shape messages and skipping."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from engine import ShapeError, Tensor, assert_shape, debug_assert_shape, set_debug_assertions
from engine.module import shape as shape_mod


class FeedForward:
    d_model = 512
    d_ff = 1024

    def check(self, output, batch_size, seq_length):
        assert_shape(output, [batch_size, seq_length, self.d_model])


def test_message_is_the_call_as_written_then_axis_sizes_and_dims():
    output = Tensor.zeros([8, 128, 2048])
    with pytest.raises(ShapeError) as info:
        FeedForward().check(output, 8, 128)
    assert str(info.value) == (
        "assert_shape(output, [batch_size, seq_length, self.d_model]): axis 2 expected 512, got 2048 "
        "(dims [8, 128, 2048])")
    assert isinstance(info.value, AssertionError)


def test_rank_error():
    x = Tensor.zeros([2, 3, 4, 5])
    with pytest.raises(ShapeError) as info:
        assert_shape(x, [2, 3, 4])
    assert str(info.value) == "assert_shape(x, [2, 3, 4]): rank 3 expected, got 4 (dims [2, 3, 4, 5])"


def test_multi_line_call_is_shown_on_one_line():
    hidden = Tensor.zeros([2, 3])
    batch = 2
    with pytest.raises(ShapeError) as info:
        assert_shape(
            hidden,
            [batch,
             3 * 2],
        )
    assert str(info.value) == "assert_shape(hidden, [batch, 3 * 2]): axis 1 expected 6, got 3 (dims [2, 3])"


def test_patterns_that_pass():
    x = Tensor.zeros([2, 3, 4])
    batch_size, seq_length, _ = x.dims()
    assert_shape(x, [batch_size, seq_length, 4])
    assert_shape(x, [2 * 1, None, 4])
    assert_shape(x, [None, None, None])
    assert_shape(x, [..., 4])
    assert_shape(x, [2, ...])
    assert_shape(x, [2, ..., 4])
    assert_shape(x, [2, 3, 4, ...])
    assert_shape(x, [...])
    assert_shape(x.reshape(6, 4), [batch_size * seq_length, 4])


def test_ellipsis_patterns_that_fail_name_the_real_axis():
    image = Tensor.zeros([2, 5, 7, 7])
    with pytest.raises(ShapeError, match=r"^assert_shape\(image, \[None, 3, \.\.\.\]\): axis 1 expected 3, got 5 "
                                         r"\(dims \[2, 5, 7, 7\]\)$"):
        assert_shape(image, [None, 3, ...])
    with pytest.raises(ShapeError, match=r": axis 3 expected 8, got 7 \(dims"):
        assert_shape(image, [..., 8])
    with pytest.raises(ShapeError, match=r": rank at least 5 expected, got 4 \(dims \[2, 5, 7, 7\]\)"):
        assert_shape(image, [1, 2, ..., 3, 4, 5])


def test_bad_patterns_raise_type_errors():
    x = Tensor.zeros([2])
    with pytest.raises(TypeError, match="at most once"):
        assert_shape(x, [..., ...])
    with pytest.raises(TypeError, match="slot must be an int"):
        assert_shape(x, ["2"])
    with pytest.raises(TypeError, match=r"expected an engine Tensor, got list"):
        assert_shape([1, 2], [2])


def test_a_value_that_is_not_a_tensor_is_a_type_error_naming_the_call_and_the_type():
    """A NumPy array has a `.shape`, but a layer cannot use it: the check refuses it at the
    boundary (not as an AttributeError from inside a kernel), with the call and a remedy."""
    x = np.zeros((2, 3))
    with pytest.raises(TypeError) as info:
        assert_shape(x, [..., 3])
    assert str(info.value) == (
        "assert_shape(x, [..., 3]): expected an engine Tensor, got numpy.ndarray "
        "(convert with Tensor.from_data(...))")
    assert not isinstance(info.value, ShapeError)  # a wrong type, not a broken contract
    with pytest.raises(TypeError) as info:
        debug_assert_shape(x, [2, None])
    assert str(info.value) == (
        "debug_assert_shape(x, [2, None]): expected an engine Tensor, got numpy.ndarray "
        "(convert with Tensor.from_data(...))")


def test_a_parameter_is_refused_with_a_hint_to_read_its_tensor():
    from engine import nn  # noqa: PLC0415

    weight = nn.LinearConfig(3, 2).init().weight
    with pytest.raises(TypeError, match=r"^assert_shape\(weight, \[3, 2\]\): expected an engine Tensor, got "
                                        r"engine\.module\.param\.Param \(read the parameter's tensor with \.val\(\)\)$"):
        assert_shape(weight, [3, 2])
    assert_shape(weight.val(), [3, 2])


def test_a_layer_given_a_numpy_array_names_its_own_contract():
    from engine import nn  # noqa: PLC0415

    linear = nn.LinearConfig(3, 2).init()
    with pytest.raises(TypeError) as info:
        linear.forward(np.ones((4, 3), dtype=np.float32))
    assert str(info.value) == (
        "assert_shape(input, [..., d_input]): expected an engine Tensor, got numpy.ndarray "
        "(convert with Tensor.from_data(...))")
    assert not linear.weight.is_initialized()  # refused before any work


def test_falls_back_to_the_evaluated_pattern_without_source():
    code = compile("assert_shape(t, [n, None, ...])", "<no-source>", "exec")
    with pytest.raises(ShapeError) as info:
        exec(code, {"assert_shape": assert_shape, "t": Tensor.zeros([3, 1]), "n": 4})
    assert str(info.value) == "assert_shape(<tensor>, [4, None, ...]): axis 0 expected 4, got 3 (dims [3, 1])"


def test_debug_assert_shape_checks_and_can_be_switched_off():
    x = Tensor.zeros([2, 3])
    with pytest.raises(ShapeError) as info:
        debug_assert_shape(x, [2, 4])
    assert str(info.value) == "debug_assert_shape(x, [2, 4]): axis 1 expected 4, got 3 (dims [2, 3])"
    set_debug_assertions(False)
    try:
        debug_assert_shape(x, [2, 4])  # skipped
        with pytest.raises(ShapeError):
            assert_shape(x, [2, 4])  # assert_shape stays on
    finally:
        set_debug_assertions(True)


def test_debug_assert_shape_is_skipped_under_python_O():
    script = textwrap.dedent("""
        from engine import Tensor, ShapeError, assert_shape, debug_assert_shape
        x = Tensor.zeros([2, 3])
        debug_assert_shape(x, [9, 9])
        try:
            assert_shape(x, [9, 9])
        except ShapeError as e:
            print("assert_shape:", e)
        print("debug skipped")
    """)
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-O", "-c", script], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "debug skipped" in out.stdout
    assert "axis 0 expected 9, got 2" in out.stdout  # assert_shape still checks under -O


def test_source_lookup_is_cached_per_code_location():
    x = Tensor.zeros([1])
    shape_mod._SOURCE_CACHE.clear()
    for _ in range(3):
        with pytest.raises(ShapeError):
            assert_shape(x, [2])
    assert len(shape_mod._SOURCE_CACHE) == 1
