"""Normalization layers: LayerNorm, BatchNorm, GroupNorm, InstanceNorm, RmsNorm, LocalResponseNorm."""
from __future__ import annotations

from dataclasses import dataclass

from ..autodiff import no_recording
from ..tensor.raw import wrap
from . import _ops
from ._base import Config, Flag, Layer, assert_shape, check_dtype, check_float, f64, init_with, initializers, state
from ..shapes.rules import expect, float_input, same
from .spec import Burn, declare

__all__ = [
    "LayerNormConfig",
    "LayerNorm",
    "BatchNormConfig",
    "BatchNorm",
    "GroupNormConfig",
    "GroupNorm",
    "InstanceNormConfig",
    "InstanceNorm",
    "RmsNormConfig",
    "RmsNorm",
    "LocalResponseNormConfig",
    "LocalResponseNorm",
]


def _ones(n, device):
    return init_with(initializers.Ones(), (n,), None, None, device)


def _zeros(n, device):
    return init_with(initializers.Zeros(), (n,), None, None, device)


# ---------------------------------------------------------------------- LayerNorm
@dataclass
class LayerNormConfig(Config):
    """Configuration of a [`LayerNorm`] layer."""

    d_model: int
    epsilon: float = 1e-5
    bias: bool = True

    def init(self, device=None) -> "LayerNorm":
        beta = _zeros(self.d_model, device) if self.bias else None
        return LayerNorm(_ones(self.d_model, device), beta, self.epsilon)


class LayerNorm(Layer):
    """Layer normalization over the last dim: `Y = norm(X) * gamma + beta`."""

    def __init__(self, gamma, beta, epsilon: float):
        super().__init__()
        self.gamma = gamma
        self.beta = beta
        self.epsilon = float(epsilon)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[..., any, d_model]`
        - output: `[..., any, d_model]`
        """
        (d_model,) = self.gamma.shape
        assert_shape(input, [..., d_model])
        gamma = self.gamma.val()
        check_dtype(self, input, gamma, param_name="gamma")
        beta = self.beta.val() if self.beta is not None else None
        return _ops.normalize(input, (-1,), self.epsilon, gamma, beta, (d_model,))

    def custom_content(self, content):
        (d_model,) = self.gamma.shape
        return (
            content.add("d_model", d_model).add("epsilon", f64(self.epsilon)).add("bias", self.beta is not None).optional()
        )


# ---------------------------------------------------------------------- BatchNorm
@dataclass
class BatchNormConfig(Config):
    """Configuration of a [`BatchNorm`] layer."""

    num_features: int
    epsilon: float = 1e-5
    momentum: float = 0.1

    def init(self, device=None) -> "BatchNorm":
        running_mean = state(initializers.Zeros(), (self.num_features,), device)
        running_var = state(initializers.Ones(), (self.num_features,), device)
        return BatchNorm(
            _ones(self.num_features, device), _zeros(self.num_features, device), running_mean, running_var,
            self.momentum, self.epsilon,
        )


class BatchNorm(Layer):
    """Batch normalization over `[batch_size, channels, ...]`: `Y = norm(X) * gamma + beta`.

    While training (the module's training flag on and an autodiff input) it normalizes with
    the batch statistics and updates `running_mean` / `running_var` (saved running state, no
    gradient): `running = running * (1 - momentum) + batch * momentum`, with the biased batch
    variance as Burn has it. Otherwise it normalizes with the running statistics.
    """

    def __init__(self, gamma, beta, running_mean, running_var, momentum: float, epsilon: float):
        super().__init__()
        self.gamma = gamma
        self.beta = beta
        self.running_mean = running_mean
        self.running_var = running_var
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)
        self.training = Flag(True)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels, ...]`
        - output: `[batch_size, channels, ...]`
        """
        (channels,) = self.beta.shape
        assert_shape(input, [None, channels, ...])
        gamma = self.gamma.val()
        check_dtype(self, input, gamma, param_name="gamma")
        rank = input.rank
        axes = (0,) + tuple(range(2, rank))
        shape = (1, channels) + (1,) * (rank - 2)
        if self.training and input.is_autodiff():
            stats = {}
            out = _ops.normalize(input, axes, self.epsilon, gamma, self.beta.val(), shape, stats)
            self._update_running(stats["mean"].reshape(channels), stats["var"].reshape(channels), input.device)
            return out
        mean = self.running_mean.val().to_device(input.device)
        var = self.running_var.val().to_device(input.device)
        scale = gamma * (var + self.epsilon).rsqrt()
        shift = self.beta.val() - mean * scale
        return input * scale.reshape(shape) + shift.reshape(shape)

    def _update_running(self, mean, var, device):
        m = self.momentum
        with no_recording():
            for name, batch in (("running_mean", mean), ("running_var", var)):
                param = getattr(self, name)
                old = param.val().inner()
                new = old.to_device(device) * (1.0 - m) + wrap(batch, device) * m
                setattr(self, name, param.map(lambda _t, v=new.to_device(old.device).inner(): v))

    def custom_content(self, content):
        (num_features,) = self.beta.shape
        return (
            content.add("num_features", num_features)
            .add("momentum", f64(self.momentum))
            .add("epsilon", f64(self.epsilon))
            .optional()
        )


# ---------------------------------------------------------------------- GroupNorm / InstanceNorm
def _check_affine_input(layer, input):
    """The input of a GroupNorm / InstanceNorm: gamma's dtype when affine, else any float."""
    if layer.gamma is not None:
        check_dtype(layer, input, layer.gamma.val(), param_name="gamma")
    else:
        check_float(layer, input)


def _group_norm(input, gamma, beta, num_groups: int, epsilon: float):
    shape = input.shape
    b, c = shape[0], shape[1]
    x = input.reshape(b, num_groups, -1)
    y = _ops.normalize(x, (2,), epsilon).reshape(shape)
    if gamma is None:
        return y
    aff = (1, c) + (1,) * (len(shape) - 2)
    return y * gamma.val().reshape(aff) + beta.val().reshape(aff)


@dataclass
class GroupNormConfig(Config):
    """Configuration of a [`GroupNorm`] layer."""

    num_groups: int
    num_channels: int
    epsilon: float = 1e-5
    affine: bool = True

    def init(self, device=None) -> "GroupNorm":
        if self.num_groups <= 0 or self.num_channels % self.num_groups != 0:
            raise ValueError(
                f"The number of channels must be divisible by the number of groups "
                f"(num_channels {self.num_channels}, num_groups {self.num_groups})"
            )
        gamma = _ones(self.num_channels, device) if self.affine else None
        beta = _zeros(self.num_channels, device) if self.affine else None
        return GroupNorm(gamma, beta, self.num_groups, self.num_channels, self.epsilon, self.affine)


class GroupNorm(Layer):
    """Group normalization: channels split into `num_groups` groups, each normalized."""

    def __init__(self, gamma, beta, num_groups: int, num_channels: int, epsilon: float, affine: bool):
        super().__init__()
        self.gamma = gamma
        self.beta = beta
        self.num_groups = int(num_groups)
        self.num_channels = int(num_channels)
        self.epsilon = float(epsilon)
        self.affine = bool(affine)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, num_channels, *]`
        - output: `[batch_size, num_channels, *]`
        """
        assert_shape(input, [None, self.num_channels, None, ...])
        _check_affine_input(self, input)
        return _group_norm(input, self.gamma, self.beta, self.num_groups, self.epsilon)

    def custom_content(self, content):
        return (
            content.add("num_groups", self.num_groups)
            .add("num_channels", self.num_channels)
            .add("epsilon", f64(self.epsilon))
            .add("affine", self.affine)
            .optional()
        )


@dataclass
class InstanceNormConfig(Config):
    """Configuration of an [`InstanceNorm`] layer."""

    num_channels: int
    epsilon: float = 1e-5
    affine: bool = True

    def init(self, device=None) -> "InstanceNorm":
        gamma = _ones(self.num_channels, device) if self.affine else None
        beta = _zeros(self.num_channels, device) if self.affine else None
        return InstanceNorm(gamma, beta, self.num_channels, self.epsilon, self.affine)


class InstanceNorm(Layer):
    """Instance normalization: each channel of each item normalized (GroupNorm, one group per channel)."""

    def __init__(self, gamma, beta, num_channels: int, epsilon: float, affine: bool):
        super().__init__()
        self.gamma = gamma
        self.beta = beta
        self.num_channels = int(num_channels)
        self.epsilon = float(epsilon)
        self.affine = bool(affine)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, num_channels, *]`
        - output: `[batch_size, num_channels, *]`
        """
        assert_shape(input, [None, self.num_channels, None, ...])
        _check_affine_input(self, input)
        return _group_norm(input, self.gamma, self.beta, self.num_channels, self.epsilon)

    def custom_content(self, content):
        return (
            content.add("num_channels", self.num_channels)
            .add("epsilon", f64(self.epsilon))
            .add("affine", self.affine)
            .optional()
        )


# ---------------------------------------------------------------------- RmsNorm
@dataclass
class RmsNormConfig(Config):
    """Configuration of an [`RmsNorm`] layer.

    `offset` (default 0) is added to `gamma` as the norm scales: `Y = X / rms(X) * (offset + gamma)`.
    Gemma's norms are `offset=1` (the stored weight is `gamma`, initialised to 0)."""

    d_model: int
    epsilon: float = 1e-5
    offset: float = 0.0

    def init(self, device=None) -> "RmsNorm":
        if not self.epsilon > 0.0:
            raise ValueError(f"epsilon must be positive, got {f64(self.epsilon)}")
        if isinstance(self.offset, bool) or not isinstance(self.offset, (int, float)):
            raise ValueError(f"offset must be a number, got {self.offset!r}")
        if self.offset == 1.0:
            return RmsNorm(_zeros(self.d_model, device), self.epsilon, offset=1.0)
        if self.offset:
            raise ValueError(f"offset must be 0 or 1 (Gemma's (1 + w)), got {self.offset!r}")
        return RmsNorm(_ones(self.d_model, device), self.epsilon)


class RmsNorm(Layer):
    """RMS normalization over the last dim: `Y = X / sqrt(mean(X^2) + eps) * gamma`, or with
    `offset` 1 (Gemma) `* (1 + gamma)`."""

    def __init__(self, gamma, epsilon: float, offset: float = 0.0):
        super().__init__()
        self.gamma = gamma
        self.epsilon = float(epsilon)
        self.offset = float(offset)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[..., any, d_model]`
        - output: `[..., any, d_model]`
        """
        (d_model,) = self.gamma.shape
        assert_shape(input, [..., d_model])
        gamma = self.gamma.val()
        check_dtype(self, input, gamma, param_name="gamma")
        if self.offset:
            gamma = gamma + self.offset
        return _ops.rms_norm(input, gamma, self.epsilon)

    def custom_content(self, content):
        (d_model,) = self.gamma.shape
        content = content.add("d_model", d_model).add("epsilon", f64(self.epsilon))
        if self.offset:
            content = content.add("offset", f64(self.offset))
        return content.optional()


# ---------------------------------------------------------------------- LocalResponseNorm
@dataclass
class LocalResponseNormConfig(Config):
    """Configuration of a [`LocalResponseNorm`] layer."""

    size: int
    alpha: float = 0.0001
    beta: float = 0.75
    k: float = 1.0

    def init(self, device=None) -> "LocalResponseNorm":
        if self.size <= 0:
            raise ValueError(f"size must be greater than 0, got {self.size}")
        return LocalResponseNorm(self.size, self.alpha, self.beta, self.k)


class LocalResponseNorm(Layer):
    """`Y = X / (k + alpha * mean_window(X^2))^beta`, the window `size` channels wide.

    For an odd size the window is centered; for an even size it takes one more channel on the
    positive side. Channels beyond the edges count as zeros.
    """

    def __init__(self, size: int, alpha: float, beta: float, k: float):
        super().__init__()
        self.size = int(size)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.k = float(k)

    def forward(self, input):
        """Applies Local Response Normalization on the input tensor.

        # Shapes

        - input: `[batch_size, channels, ...]` (rank >= 3)
        - output: `[batch_size, channels, ...]`
        """
        assert_shape(input, [None, None, None, ...])
        check_float(self, input)
        rank = input.rank
        c = input.shape[1]
        left, right = (self.size - 1) // 2, self.size // 2
        sq = input * input
        padded = sq.pad([0, 0] * (rank - 2) + [left, right])
        total = padded.narrow(1, 0, c)
        for j in range(1, self.size):
            total = total + padded.narrow(1, j, c)
        denom = (total * (self.alpha / self.size) + self.k).powf(self.beta)
        return input / denom

    def custom_content(self, content):
        return (
            content.add("size", self.size)
            .add("alpha", f64(self.alpha))
            .add("beta", f64(self.beta))
            .add("k", f64(self.k))
            .optional()
        )


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _layer_norm_shape(m, ins, ctx):
    (d_model,) = m.gamma.shape
    expect("assert_shape(input, [..., d_model])", ins[0], [..., d_model])
    float_input(type(m).__name__, ins[0])
    return same(ins[0])


def _batch_norm_shape(m, ins, ctx):
    (channels,) = m.beta.shape
    expect("assert_shape(input, [None, channels, ...])", ins[0], [None, channels, ...])
    float_input("BatchNorm", ins[0])
    return same(ins[0])


def _group_norm_shape(m, ins, ctx):
    expect("assert_shape(input, [None, self.num_channels, None, ...])", ins[0], [None, m.num_channels, None, ...])
    float_input(type(m).__name__, ins[0])
    return same(ins[0])


def _lrn_shape(m, ins, ctx):
    expect("assert_shape(input, [None, None, None, ...])", ins[0], [None, None, None, ...])
    float_input("LocalResponseNorm", ins[0])
    return same(ins[0])


declare(LayerNorm, RmsNorm, shape=_layer_norm_shape)
declare(BatchNorm, shape=_batch_norm_shape)
declare(GroupNorm, InstanceNorm, shape=_group_norm_shape)
declare(LocalResponseNorm, shape=_lrn_shape)
declare(BatchNorm, LayerNorm, GroupNorm, InstanceNorm, RmsNorm, burn=Burn(""))
