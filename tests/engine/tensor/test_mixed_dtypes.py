"""Mixed dtypes in tensor operations: one documented rule per kind of operation.

- matmul and the convolutions need one dtype for all operands (PyTorch's matmul refuses
  float32 @ float64 too): a `DTypeError` names the op and both dtypes, nothing is promoted;
- elementwise arithmetic promotes float32 with float64 to float64, as NumPy and PyTorch do,
  and sends each operand's gradient back in the operand's own dtype.
"""
import numpy as np
import pytest

from engine import Tensor, TensorError
from engine.tensor import DTypeError


def f32(shape):
    return Tensor.from_data(np.arange(np.prod(shape), dtype=np.float32).reshape(shape) / 10)


def f64(shape):
    return Tensor.from_data(np.arange(np.prod(shape), dtype=np.float64).reshape(shape) / 10, dtype="float64")


def test_matmul_refuses_float32_with_float64_naming_both():
    with pytest.raises(DTypeError) as info:
        f32((2, 3)) @ f64((3, 4))
    assert str(info.value) == ("matmul: expected both operands of one dtype, got float32 @ float64 "
                               "(dims [2, 3] @ [3, 4]); convert one of them with .cast(...)")
    assert isinstance(info.value, TensorError) and isinstance(info.value, TypeError)
    with pytest.raises(DTypeError, match=r"got float64 @ float32"):
        f64((2, 2, 3)).matmul(f32((3, 1)))


def test_matmul_refuses_int_with_float_and_ints_of_two_widths():
    ints = Tensor.from_data(np.ones((2, 3), dtype=np.int64))
    with pytest.raises(DTypeError, match=r"got int64 @ float32"):
        ints @ f32((3, 2))
    with pytest.raises(DTypeError, match=r"got int64 @ int32"):
        ints @ Tensor.from_data(np.ones((3, 2), dtype=np.int32))
    same = ints @ Tensor.from_data(np.ones((3, 2), dtype=np.int64))
    assert same.dtype == "int64" and same.numpy().tolist() == [[3, 3], [3, 3]]


def test_matmul_of_one_dtype_keeps_it_and_its_gradients():
    for make, name in ((f32, "float32"), (f64, "float64")):
        a, b = make((2, 3)).require_grad(), make((3, 4)).require_grad()
        out = a @ b
        assert out.dtype == name
        grads = out.sum().backward()
        assert a.grad(grads).dtype == name and b.grad(grads).dtype == name


@pytest.mark.parametrize("op,x,w", [
    ("conv1d", (1, 2, 6), (3, 2, 3)),
    ("conv2d", (1, 2, 5, 5), (3, 2, 3, 3)),
    ("conv_transpose2d", (1, 2, 4, 4), (2, 3, 3, 3)),
])
def test_convolutions_refuse_an_input_of_another_dtype_than_the_weight(op, x, w):
    with pytest.raises(DTypeError) as info:
        getattr(f64(x), op)(f32(w))
    assert str(info.value).startswith(f"{op}: the input is float64 but the weight is float32 (input dims {list(x)}, "
                                      f"weight dims {list(w)}); convert one of them with .cast(...)")
    channels_out = w[0] if not op.startswith("conv_transpose") else w[1]
    with pytest.raises(DTypeError, match=rf"^{op}: the input is float32 but the bias is float64"):
        getattr(f32(x), op)(f32(w), f64((channels_out,)))
    out = getattr(f64(x), op)(f64(w), f64((channels_out,)))
    assert out.dtype == "float64"


def test_elementwise_arithmetic_promotes_float32_with_float64_and_grads_keep_each_dtype():
    a = f32((2, 3)).require_grad()
    b = f64((3,)).require_grad()
    for out in (a + b, b - a, a * b, b / (a + 1.0)):
        assert out.dtype == "float64"
    y = (a * b + a - b / 2.0).sum()
    grads = y.backward()
    ga, gb = a.grad(grads), b.grad(grads)
    assert ga.dtype == "float32" and ga.shape == (2, 3)
    assert gb.dtype == "float64" and gb.shape == (3,)
    np.testing.assert_allclose(ga.numpy(), np.broadcast_to(b.numpy() + 1.0, (2, 3)), rtol=1e-6)
    np.testing.assert_allclose(gb.numpy(), a.numpy().sum(axis=0) - 1.0, rtol=1e-6)
