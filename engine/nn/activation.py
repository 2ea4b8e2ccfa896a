"""Activation layers, Burn's names: Gelu (exact erf form), Relu, LeakyRelu, PRelu, SwiGlu, ...

Parameter-free activations are modules without fields (they print as their name, `Relu`);
those with settings have a `…Config` whose `init()` takes no device, except PRelu and SwiGlu,
which hold parameters. `ActivationConfig` picks one by name for layers that take an activation
(Lstm, Gru, the transformer's feed-forward block).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import _ops
from ._base import Config, Layer, Module, assert_shape, check_dtype, f64, init_with, initializers, row_settings
from .linear import LinearConfig
from ..shapes.rules import RuleError, Shape, dims_text, elementwise, expect, float_input, same, with_dim
from .spec import Burn, declare

__all__ = [
    "Gelu", "GeluTanh", "Relu", "Relu6", "Selu", "Sigmoid", "Tanh", "SiLU", "HardSwish", "Mish", "Softsign",
    "LogSigmoid", "Tanhshrink",
    "LeakyReluConfig", "LeakyRelu", "PReluConfig", "PRelu", "EluConfig", "Elu", "CeluConfig", "Celu",
    "HardSigmoidConfig", "HardSigmoid", "HardtanhConfig", "Hardtanh", "SoftplusConfig", "Softplus",
    "HardShrinkConfig", "HardShrink", "SoftShrinkConfig", "SoftShrink", "ThresholdedReluConfig",
    "ThresholdedRelu", "GLU", "Glu", "SwiGluConfig", "SwiGlu", "ActivationConfig",
]


class _Elementwise(Module):
    """An activation without settings: `forward` applies `_fn` to every entry."""

    def __init__(self):
        super().__init__()

    def _fn(self, x):  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def forward(self, input):
        """Applies the activation to every entry.

        # Shapes

        - input: `[..., any]`
        - output: `[..., any]`
        """
        assert_shape(input, [None, ...])
        return self._fn(input)


_GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)


class Gelu(_Elementwise):
    """Gaussian Error Linear Unit, exact form: `x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2)))`.

    `Gelu.tanh_approximate()` is the tanh approximation instead (GPT-2's `gelu_new`, torch's
    `gelu(approximate="tanh")`): `x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))`; it
    prints as `Gelu {approximate: tanh}`. `Gelu()` stays the exact form and prints as `Gelu`.
    """

    approximate = "none"  # "tanh" on the instances made by tanh_approximate()

    @classmethod
    def tanh_approximate(cls) -> "Gelu":
        gelu = cls()
        gelu.approximate = "tanh"
        return gelu

    def _fn(self, x):
        if self.approximate == "tanh":
            inner = (x + x * x * x * 0.044715) * _GELU_TANH_SCALE
            return x * 0.5 * (inner.tanh() + 1.0)
        return _ops.gelu(x)

    def custom_settings(self):
        return row_settings() if self.approximate == "tanh" else None

    def custom_content(self, content):
        if self.approximate == "tanh":
            content = content.add("approximate", "tanh")
        return content.optional()


class GeluTanh(Gelu):
    """GELU's tanh approximation as a layer of its own: torch's `nn.GELU(approximate="tanh")`, Hugging Face's
    `gelu_pytorch_tanh` / `gelu_new` (Gemma, Phi, GPT-2): `x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))`.

    The same computation as `Gelu.tanh_approximate()`, with a kind of its own in the designer and a name in
    ONNX import (`Gelu` with `approximate="tanh"`, opset 20).
    """

    approximate = "tanh"

    def custom_settings(self):
        return None

    def custom_content(self, content):
        return content.optional()


def _tanh_gelu(attrs):
    return {} if attrs.get("approximate") == "tanh" else None


# Its shape rule, ONNX import and catalog entry (the catalog reads the class: no settings, file "activation":
# General); Burn's Gelu has no tanh form, so no `burn=` (the Rust export says so).
declare(GeluTanh, shape=elementwise, onnx={"Gelu": _tanh_gelu})


class Relu(_Elementwise):
    """`max(0, x)`."""

    def _fn(self, x):
        return x.relu()


class Relu6(_Elementwise):
    """`min(max(0, x), 6)`."""

    def _fn(self, x):
        return _ops.relu6(x)


class Selu(_Elementwise):
    """Scaled exponential linear unit (the self-normalizing constants of Klambauer et al.)."""

    def _fn(self, x):
        return _ops.selu(x)


class Sigmoid(_Elementwise):
    """`1 / (1 + exp(-x))`."""

    def _fn(self, x):
        return x.sigmoid()


class Tanh(_Elementwise):
    """Hyperbolic tangent."""

    def _fn(self, x):
        return x.tanh()


class SiLU(_Elementwise):
    """Sigmoid linear unit (swish): `x * sigmoid(x)`."""

    def _fn(self, x):
        return _ops.silu(x)


class HardSwish(_Elementwise):
    """`x * relu6(x + 3) / 6`."""

    def _fn(self, x):
        return _ops.hard_swish(x)


class Mish(_Elementwise):
    """`x * tanh(softplus(x))`."""

    def _fn(self, x):
        return _ops.mish(x)


class Softsign(_Elementwise):
    """`x / (1 + |x|)`."""

    def _fn(self, x):
        return _ops.softsign(x)


class LogSigmoid(_Elementwise):
    """`log(sigmoid(x))`, computed stably."""

    def _fn(self, x):
        return _ops.log_sigmoid(x)


class Tanhshrink(_Elementwise):
    """`x - tanh(x)`."""

    def _fn(self, x):
        return _ops.tanhshrink(x)


# ---------------------------------------------------------------------- with settings
class _Configured(_Elementwise, Layer):
    """An activation whose plain float settings are its display content, on one line."""

    _display: tuple[str, ...] = ()

    def custom_content(self, content):
        for name in self._display:
            content = content.add(name, f64(getattr(self, name)))
        return content.optional()


@dataclass
class LeakyReluConfig(Config):
    """Configuration of a [`LeakyRelu`] layer."""

    negative_slope: float = 0.01

    def init(self, device=None) -> "LeakyRelu":
        return LeakyRelu(self.negative_slope)


class LeakyRelu(_Configured):
    """`x` for `x >= 0`, `negative_slope * x` otherwise."""

    _display = ("negative_slope",)

    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = float(negative_slope)

    def _fn(self, x):
        return _ops.leaky_relu(x, self.negative_slope)


@dataclass
class EluConfig(Config):
    """Configuration of an [`Elu`] layer."""

    alpha: float = 1.0

    def init(self, device=None) -> "Elu":
        return Elu(self.alpha)


class Elu(_Configured):
    """`x` for `x > 0`, `alpha * (exp(x) - 1)` otherwise."""

    _display = ("alpha",)

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = float(alpha)

    def _fn(self, x):
        return _ops.elu(x, self.alpha)


@dataclass
class CeluConfig(Config):
    """Configuration of a [`Celu`] layer."""

    alpha: float = 1.0

    def init(self, device=None) -> "Celu":
        return Celu(self.alpha)


class Celu(_Configured):
    """`max(0, x) + min(0, alpha * (exp(x / alpha) - 1))`."""

    _display = ("alpha",)

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = float(alpha)

    def _fn(self, x):
        return _ops.celu(x, self.alpha)


@dataclass
class HardSigmoidConfig(Config):
    """Configuration of a [`HardSigmoid`] layer."""

    alpha: float = 0.2
    beta: float = 0.5

    def init(self, device=None) -> "HardSigmoid":
        return HardSigmoid(self.alpha, self.beta)


class HardSigmoid(_Configured):
    """`max(0, min(1, alpha * x + beta))`."""

    _display = ("alpha", "beta")

    def __init__(self, alpha: float = 0.2, beta: float = 0.5):
        super().__init__()
        self.alpha = float(alpha)
        self.beta = float(beta)

    def _fn(self, x):
        return _ops.hard_sigmoid(x, self.alpha, self.beta)


@dataclass
class HardtanhConfig(Config):
    """Configuration of a [`Hardtanh`] layer."""

    min_val: float = -1.0
    max_val: float = 1.0

    def init(self, device=None) -> "Hardtanh":
        return Hardtanh(self.min_val, self.max_val)


class Hardtanh(_Configured):
    """Clamps each entry into `[min_val, max_val]`."""

    _display = ("min_val", "max_val")

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0):
        super().__init__()
        self.min_val = float(min_val)
        self.max_val = float(max_val)

    def _fn(self, x):
        return _ops.hardtanh(x, self.min_val, self.max_val)


@dataclass
class SoftplusConfig(Config):
    """Configuration of a [`Softplus`] layer."""

    beta: float = 1.0

    def init(self, device=None) -> "Softplus":
        return Softplus(self.beta)


class Softplus(_Configured):
    """`log(1 + exp(beta * x)) / beta`."""

    _display = ("beta",)

    def __init__(self, beta: float = 1.0):
        super().__init__()
        self.beta = float(beta)

    def _fn(self, x):
        return _ops.softplus(x, self.beta)


@dataclass
class HardShrinkConfig(Config):
    """Configuration of a [`HardShrink`] layer."""

    lambd: float = 0.5

    def init(self, device=None) -> "HardShrink":
        return HardShrink(self.lambd)


class HardShrink(_Configured):
    """`x` where `|x| > lambda`, else 0 (Burn calls the setting `lambda`)."""

    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = float(lambd)

    def _fn(self, x):
        return _ops.hard_shrink(x, self.lambd)

    def custom_content(self, content):
        return content.add("lambda", f64(self.lambd)).optional()


@dataclass
class SoftShrinkConfig(Config):
    """Configuration of a [`SoftShrink`] layer."""

    lambd: float = 0.5
    bias: float = 0.5

    def init(self, device=None) -> "SoftShrink":
        return SoftShrink(self.lambd, self.bias)


class SoftShrink(_Configured):
    """`x - bias` where `x > lambda`, `x + bias` where `x < -lambda`, else 0."""

    def __init__(self, lambd: float = 0.5, bias: float = 0.5):
        super().__init__()
        self.lambd = float(lambd)
        self.bias = float(bias)

    def _fn(self, x):
        return _ops.soft_shrink(x, self.lambd, self.bias)

    def custom_content(self, content):
        return content.add("lambda", f64(self.lambd)).add("bias", f64(self.bias)).optional()


@dataclass
class ThresholdedReluConfig(Config):
    """Configuration of a [`ThresholdedRelu`] layer."""

    alpha: float = 1.0

    def init(self, device=None) -> "ThresholdedRelu":
        return ThresholdedRelu(self.alpha)


class ThresholdedRelu(_Configured):
    """`x` where `x > alpha`, else 0."""

    _display = ("alpha",)

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = float(alpha)

    def _fn(self, x):
        return _ops.thresholded_relu(x, self.alpha)


# ---------------------------------------------------------------------- with parameters
@dataclass
class PReluConfig(Config):
    """Configuration of a [`PRelu`] layer: `num_parameters` weights starting at `alpha`."""

    num_parameters: int = 1
    alpha: float = 0.25

    def init(self, device=None) -> "PRelu":
        weight = init_with(initializers.Constant(value=self.alpha), (self.num_parameters,), None, None, device)
        return PRelu(weight, self.alpha)


class PRelu(Layer):
    """Parametric ReLU: `x` for `x >= 0`, `alpha * x` otherwise, with learnt `alpha`.

    `alpha` has one weight, or one per channel (dim 1 of the input).
    """

    def __init__(self, alpha, alpha_value: float):
        super().__init__()
        self.alpha = alpha
        self.alpha_value = float(alpha_value)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[..., any]`
        - output: `[..., any]`
        """
        (n,) = self.alpha.shape
        if n == 1:
            assert_shape(input, [None, ...])
        else:
            assert_shape(input, [None, n, ...])
        alpha = self.alpha.val()
        check_dtype(self, input, alpha, param_name="alpha")
        return _ops.prelu(input, alpha)

    def custom_content(self, content):
        (n,) = self.alpha.shape
        return content.add("num_parameters", n).add("alpha_value", f64(self.alpha_value)).optional()


class GLU(Module):
    """Gated linear unit: the input halves `a`, `b` along `dim` give `a * sigmoid(b)`.

    Burn's GLU prints with its default display (`GLU {\\n  dim: 1\\n}`).
    """

    def __init__(self, dim: int):
        super().__init__()
        self.dim = int(dim)

    def forward(self, input):
        """Applies the gated linear unit.

        # Shapes

        - input: `[..., 2 * n, ...]` (`2 * n` at `dim`)
        - output: `[..., n, ...]`
        """
        assert_shape(input, [None, ...])
        d = self.dim if self.dim >= 0 else self.dim + input.rank
        if not 0 <= d < input.rank:
            raise ValueError(f"GLU: dim {self.dim} is out of range for an input of dims {list(input.shape)}")
        size = input.shape[d]
        if size % 2:
            raise ValueError(
                f"GLU: input tensor along dimension {self.dim} must have an even size, got {size} "
                f"(dims {list(input.shape)})"
            )
        half = size // 2
        return input.narrow(d, 0, half) * input.narrow(d, half, half).sigmoid()


Glu = GLU


def _kaiming_default():
    return initializers.KaimingUniform(gain=1.0 / math.sqrt(3.0), fan_out_only=False)


@dataclass
class SwiGluConfig(Config):
    """Configuration of a [`SwiGlu`] layer (two linear maps, bias off by default)."""

    d_input: int
    d_output: int
    bias: bool = False
    initializer: object = field(default_factory=_kaiming_default)

    def init(self, device=None) -> "SwiGlu":
        lin = LinearConfig(self.d_input, self.d_output, self.bias, self.initializer)
        return SwiGlu(lin.init(device), lin.init(device))


class SwiGlu(Layer):
    """`SwiGLU(x) = silu(x W_inner + b_inner) * (x W_outer + b_outer)`."""

    def __init__(self, linear_inner, linear_outer):
        super().__init__()
        self.linear_inner = linear_inner
        self.linear_outer = linear_outer

    def forward(self, input):
        """Applies the Swish gated linear unit.

        # Shapes

        - input: `[..., d_input]`
        - output: `[..., d_output]`
        """
        d_input, _ = self.linear_inner.weight.shape
        assert_shape(input, [..., d_input])
        check_dtype(self, input, self.linear_inner.weight.val())
        return _ops.silu(self.linear_inner.forward(input)) * self.linear_outer.forward(input)

    def custom_content(self, content):
        d_input, d_output = self.linear_inner.weight.shape
        return (
            content.add("d_input", d_input)
            .add("d_output", d_output)
            .add("bias", self.linear_inner.bias is not None)
            .optional()
        )


# ---------------------------------------------------------------------- selection by name
_UNIT = {
    "gelu": Gelu, "relu": Relu, "relu6": Relu6, "selu": Selu, "sigmoid": Sigmoid, "tanh": Tanh,
    "silu": SiLU, "hardswish": HardSwish, "mish": Mish, "softsign": Softsign, "logsigmoid": LogSigmoid,
    "tanhshrink": Tanhshrink,
}
_CONFIGS = {
    "leakyrelu": LeakyReluConfig, "prelu": PReluConfig, "elu": EluConfig, "celu": CeluConfig,
    "hardsigmoid": HardSigmoidConfig, "hardtanh": HardtanhConfig, "softplus": SoftplusConfig,
    "hardshrink": HardShrinkConfig, "softshrink": SoftShrinkConfig, "thresholdedrelu": ThresholdedReluConfig,
}


@dataclass(frozen=True)
class ActivationConfig:
    """Burn's `ActivationConfig`: an activation chosen by name, with its config when it has one.

    `ActivationConfig("Gelu")`, `ActivationConfig("LeakyRelu", LeakyReluConfig(0.1))`, or
    `ActivationConfig.of(SoftplusConfig(2.0))`; `init(device)` builds the layer.
    """

    name: str
    config: object = None

    @staticmethod
    def of(value) -> "ActivationConfig":
        """An ActivationConfig from a name, an activation config, or an ActivationConfig."""
        if isinstance(value, ActivationConfig):
            return value
        if isinstance(value, str):
            return ActivationConfig(value)
        for key, cls in _CONFIGS.items():
            if isinstance(value, cls):
                return ActivationConfig(cls.__name__[: -len("Config")], value)
        if isinstance(value, SwiGluConfig):
            return ActivationConfig("SwiGlu", value)
        raise TypeError(f"ActivationConfig: expected an activation name or config, got {value!r}")

    def init(self, device=None) -> Module:
        key = self.name.replace("_", "").lower()
        if key in _UNIT:
            return _UNIT[key]()
        if key in _CONFIGS:
            cfg = self.config if self.config is not None else _CONFIGS[key]()
            return cfg.init(device)
        if key == "swiglu":
            if self.config is None:
                raise ValueError("ActivationConfig('SwiGlu') needs a SwiGluConfig (its sizes)")
            return self.config.init(device)
        names = sorted({c.__name__ for c in _UNIT.values()} | {c.__name__[:-6] for c in _CONFIGS.values()} | {"SwiGlu"})
        raise ValueError(f"unknown activation {self.name!r}: expected one of {names}")


for _name in ("Gelu", "Relu", "Sigmoid", "Tanh", "HardSwish", "Relu6", "SiLU", "Mish", "Selu"):
    setattr(ActivationConfig, _name, ActivationConfig(_name))


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _prelu_shape(m, ins, ctx):
    (n,) = m.alpha.shape
    if n == 1:
        expect("assert_shape(input, [None, ...])", ins[0], [None, ...])
    else:
        expect("assert_shape(input, [None, n, ...])", ins[0], [None, n, ...])
    float_input("PRelu", ins[0])
    return same(ins[0])


def _glu_shape(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, ...])", t, [None, ...])
    d = m.dim if m.dim >= 0 else m.dim + t.rank
    if not 0 <= d < t.rank:
        raise RuleError(f"GLU: dim {m.dim} is out of range for an input of dims {dims_text(t.dims)}")
    size = t.dims[d]
    ctx.require(size, "multiple", 2, lambda: f"GLU: input tensor along dimension {m.dim} must have an even size, "
                                             f"got {size} (dims {dims_text(t.dims)})")
    return Shape(with_dim(t.dims, d, size // 2), t.dtype)


def _swiglu_shape(m, ins, ctx):
    d_input, d_output = m.linear_inner.weight.shape
    expect("assert_shape(input, [..., d_input])", ins[0], [..., d_input])
    float_input("SwiGlu", ins[0])
    return Shape(with_dim(ins[0].dims, -1, d_output))


declare(Gelu, Relu, Relu6, Selu, Sigmoid, Tanh, SiLU, HardSwish, Mish, Softsign, LogSigmoid, Tanhshrink, LeakyRelu,
        Elu, Celu, HardSigmoid, Hardtanh, Softplus, HardShrink, SoftShrink, ThresholdedRelu, shape=elementwise)
declare(PRelu, shape=_prelu_shape)
declare(GLU, shape=_glu_shape)
declare(SwiGlu, shape=_swiglu_shape)


def _exact_gelu(attrs):
    return {} if attrs.get("approximate", "none") == "none" else None


declare(Relu, onnx={"Relu": {}})
declare(Sigmoid, onnx={"Sigmoid": {}})
declare(Tanh, onnx={"Tanh": {}})
declare(Softsign, onnx={"Softsign": {}})
declare(HardSwish, onnx={"HardSwish": {}})
declare(Mish, onnx={"Mish": {}})
declare(Softplus, onnx={"Softplus": {}})
declare(Gelu, onnx={"Gelu": _exact_gelu})
declare(LeakyRelu, onnx={"LeakyRelu": lambda at: {"negative_slope": float(at.get("alpha", 0.01))}})
declare(Elu, onnx={"Elu": lambda at: {"alpha": float(at.get("alpha", 1.0))}})
declare(Celu, onnx={"Celu": lambda at: {"alpha": float(at.get("alpha", 1.0))}})
declare(HardSigmoid, onnx={"HardSigmoid": lambda at: {"alpha": float(at.get("alpha", 0.2)),
                                                      "beta": float(at.get("beta", 0.5))}})
declare(Gelu, Relu, Sigmoid, Tanh, burn=Burn("", config=False, device=False))
declare(LeakyRelu, HardSigmoid, burn=Burn("", device=False))
declare(PRelu, SwiGlu, burn=Burn(""))
# Offered where a layer takes an activation (the designer's choices, in this file's __all__ order).
declare(Gelu, Relu, Relu6, Selu, Sigmoid, Tanh, SiLU, HardSwish, Mish, Softsign, LogSigmoid, Tanhshrink, LeakyRelu,
        PRelu, Elu, Celu, HardSigmoid, Hardtanh, Softplus, HardShrink, SoftShrink, ThresholdedRelu, activation=True)
