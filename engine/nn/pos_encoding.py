"""Positional encodings: sinusoidal `PositionalEncoding` and rotary `RotaryEncoding`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..tensor import Tensor
from ..tensor.device import as_device
from . import _ops
from ._base import Config, Layer, assert_shape, check_float
from ..shapes.rules import expect, float_input, same
from .spec import Burn, declare
from .rope_scaling import DynamicNtkRopeScaling, LongRopeScaling, YarnRopeScaling

__all__ = ["PositionalEncodingConfig", "PositionalEncoding", "generate_sinusoids", "RotaryEncodingConfig",
           "RotaryEncoding", "Llama3RopeScaling", "LinearRopeScaling", "YarnRopeScaling", "DynamicNtkRopeScaling",
           "LongRopeScaling"]


def generate_sinusoids(length: int, d_model: int, max_timescale: int, device=None) -> Tensor:
    """`[length, d_model]`: sin / cos pairs of position `i` at frequencies `exp(-k ln(T) / d)`
    (computed in float32, as Burn does)."""
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    if max_timescale < length:
        raise ValueError(f"max_timescale must be greater than length (max_timescale {max_timescale}, length {length})")
    inc = np.float32(-np.log(np.float32(max_timescale)) / np.float32(d_model))
    k = np.arange(0, d_model, 2, dtype=np.float32)
    div = np.exp(k * inc).astype(np.float32)
    pos = np.arange(length, dtype=np.float32)[:, None]
    angles = (div[None, :] * pos).astype(np.float32)
    out = np.empty((length, d_model), dtype=np.float32)
    out[:, 0::2] = np.sin(angles)
    out[:, 1::2] = np.cos(angles)
    return Tensor.from_data(out, device=device)


@dataclass
class PositionalEncodingConfig(Config):
    """Configuration of a [`PositionalEncoding`] layer."""

    d_model: int
    max_sequence_size: int = 5000
    max_timescale: int = 10000

    def init(self, device=None) -> "PositionalEncoding":
        sin = generate_sinusoids(self.max_sequence_size, self.d_model, self.max_timescale, device)
        return PositionalEncoding(sin.unsqueeze(0), self.max_sequence_size, self.max_timescale)


class PositionalEncoding(Layer):
    """Adds the sinusoids of "Attention Is All You Need" to the input (a constant, not a parameter)."""

    def __init__(self, sinusoids, max_sequence_size: int, max_timescale: int):
        super().__init__()
        self.sinusoids = sinusoids
        self.max_sequence_size = int(max_sequence_size)
        self.max_timescale = int(max_timescale)

    def forward(self, input):
        """Applies the forward pass on the input tensor by adding the sinusoids to the input.

        # Shapes

        - input: `[batch_size, seq_length, d_model]`
        - output: `[batch_size, seq_length, d_model]`
        """
        _, max_sequence_size, d_model = self.sinusoids.shape
        assert_shape(input, [None, None, d_model])
        check_float(self, input)
        seq_length = input.dims()[1]
        if seq_length > max_sequence_size:
            raise ValueError(
                f"max_sequence_size({max_sequence_size}) must be greater or equal than length({seq_length})"
            )
        sin = self.sinusoids.to_device(input.device).narrow(1, 0, seq_length)
        return input + sin.cast(input.dtype)

    def custom_content(self, content):
        d_model = self.sinusoids.shape[2]
        return (
            content.add("d_model", d_model)
            .add("max_sequence_size", self.max_sequence_size)
            .add("max_timescale", self.max_timescale)
            .optional()
        )


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3's frequency scaling of a rotary encoding (transformers' `rope_type: "llama3"`):
    frequencies whose wavelength exceeds `original_max_position_embeddings / low_freq_factor` are
    divided by `factor`, those below `original_max_position_embeddings / high_freq_factor` are kept,
    and the ones between are blended smoothly. Called on the inverse frequencies (float32)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self):
        if not self.factor > 0 or not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(f"Llama3RopeScaling: expected factor > 0 and high_freq_factor > low_freq_factor > 0, "
                             f"got factor {self.factor}, low_freq_factor {self.low_freq_factor}, high_freq_factor "
                             f"{self.high_freq_factor}")
        if not int(self.original_max_position_embeddings) > 0:
            raise ValueError(f"Llama3RopeScaling: original_max_position_embeddings must be positive, got "
                             f"{self.original_max_position_embeddings}")

    def __call__(self, inv_freq):
        inv = np.asarray(inv_freq, dtype=np.float32)
        f32 = np.float32
        old = f32(self.original_max_position_embeddings)
        low, high, factor = f32(self.low_freq_factor), f32(self.high_freq_factor), f32(self.factor)
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = (f32(2.0 * np.pi) / inv).astype(np.float32)
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv).astype(np.float32)
        smooth = ((old / wavelen - low) / (high - low)).astype(np.float32)
        smoothed = ((f32(1.0) - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)


@dataclass(frozen=True)
class LinearRopeScaling:
    """Position interpolation (transformers' `rope_type: "linear"`): every frequency divided by
    `factor`."""

    factor: float

    def __post_init__(self):
        if not self.factor > 0:
            raise ValueError(f"LinearRopeScaling: factor must be positive, got {self.factor}")

    def __call__(self, inv_freq):
        return (np.asarray(inv_freq, dtype=np.float32) / np.float32(self.factor)).astype(np.float32)


@dataclass
class RotaryEncodingConfig(Config):
    """Configuration of a [`RotaryEncoding`] layer.

    `scaling` (optional) maps the inverse frequencies `theta^(-2i / d_model)`, a float32 array
    `[d_model / 2]`, to the ones used (`Llama3RopeScaling`, `LinearRopeScaling`, or any function of
    that array); `init_with_frequency_scaling(scaling)` is Burn's builder for it.
    """

    max_sequence_length: int
    d_model: int
    theta: float = 10000.0
    scaling: object | None = None

    def init(self, device=None) -> "RotaryEncoding":
        if self.d_model % 2:
            raise ValueError(f"The input embedding dimension must be even, got d_model {self.d_model}")
        if not self.theta > 0.0:
            raise ValueError("Theta parameter must be positive (default: 10000).")
        if self.scaling is not None and not callable(self.scaling):
            raise ValueError(f"RotaryEncodingConfig.scaling must be a function of the inverse frequencies, got "
                             f"{type(self.scaling).__name__}")
        return RotaryEncoding(self.max_sequence_length, self.d_model, self.theta, device, scaling=self.scaling)

    def init_with_frequency_scaling(self, scaling, device=None) -> "RotaryEncoding":
        """Burn's `init_with_frequency_scaling`: the encoding with `scaling` applied to its inverse
        frequencies (a function of a float32 array `[d_model / 2]` returning one of that shape)."""
        import dataclasses  # noqa: PLC0415

        return dataclasses.replace(self, scaling=scaling).init(device)


class RotaryEncoding(Layer):
    """Rotary position encoding (RoFormer): rotates each pair `(x[2i], x[2i+1])` of the last
    dim at position `p` by the angle `p * theta^(-2i / d_model)` (the inverse frequency
    `theta^(-2i / d_model)` passed through `scaling` when one is set).

    The rotation table (up to `[max_sequence_length, d_model / 2]`) is computed on first use per
    device, for the positions used so far, and cached outside the module's fields, so building
    and displaying a large model with rotary encoding allocates nothing.
    """

    def __init__(self, max_sequence_length: int, d_model: int, theta: float, device=None, scaling=None):
        super().__init__()
        self.max_sequence_length = int(max_sequence_length)
        self.d_model = int(d_model)
        self.theta = float(np.float32(theta))
        self.scaling = scaling
        self._cache = {}

    def inverse_frequencies(self, seq_len: int | None = None) -> np.ndarray:
        """The float32 inverse frequencies `[d_model / 2]`, after `scaling` (for a scaling that
        changes with the length, `engine.nn.rope_scaling`: those of a call reaching `seq_len`
        positions; None: the table at initialization)."""
        exponent = np.arange(0, self.d_model, 2, dtype=np.float32) / np.float32(self.d_model)
        inv = (1.0 / np.exp(exponent * np.float32(np.log(np.float32(self.theta))))).astype(np.float32)
        scaling = self.__dict__.get("scaling")
        if scaling is not None:
            out = scaling.at_length(inv, seq_len) if hasattr(scaling, "at_length") else scaling(inv)
            out = np.asarray(out.numpy() if isinstance(out, Tensor) else out, dtype=np.float32)
            if out.shape != inv.shape:
                raise ValueError(f"RotaryEncoding: the frequency scaling returned dims {list(out.shape)}, "
                                 f"expected {list(inv.shape)}")
            inv = out
        return inv

    def attention_factor(self) -> float:
        """What cos and sin are multiplied by (the scaling's `attention_factor`; 1 without one)."""
        return float(getattr(self.__dict__.get("scaling"), "attention_factor", 1.0))

    def frequencies(self, device=None, length: int | None = None):
        """(cos, sin) arrays `[rows, d_model / 2]` on `device`: all `max_sequence_length` rows, or
        with `length` at least that many (the table grows as longer inputs come, so a model with
        a 128k-position encoding holds only the rows it has used). Row `p` holds the angles of
        position `p` whatever the table's size. A scaling that changes with the length (dynamic
        NTK, LongRoPE) gives the table of a call reaching `length` positions."""
        dev = as_device(device)
        cache = self.__dict__.setdefault("_cache", {})
        scaling = self.__dict__.get("scaling")
        variant = scaling.variant(length) if hasattr(scaling, "variant") else None
        key = dev if variant is None else (dev, variant)
        hit = cache.get(key)
        full = self.max_sequence_length
        need = full if length is None else min(max(int(length), 0), full)
        if hit is None or hit[0].shape[0] < need:
            have = 0 if hit is None else hit[0].shape[0]
            rows = full if length is None else min(full, max(need, 2 * have, 1024))
            inv = self.inverse_frequencies(length if variant is not None else None)
            angles = np.arange(rows, dtype=np.float32)[:, None] * inv[None, :]
            cos, sin = np.cos(angles), np.sin(angles)
            factor = self.attention_factor()
            if factor != 1.0:
                cos, sin = (cos * np.float32(factor)).astype(np.float32), (sin * np.float32(factor)).astype(np.float32)
            if variant is not None and len(cache) > 8:  # dynamic NTK: one table per length; keep the last few
                for k in [k for k in cache if isinstance(k, tuple)][:-4]:
                    del cache[k]
            hit = (dev.asarray(cos), dev.asarray(sin))
            cache[key] = hit
        return hit

    def forward(self, x):
        """Applies rotary positional encoding.

        # Shapes

        - x: `[..., seq_length, d_model]` (e.g. `[batch, seq, d]` or `[batch, heads, seq, d]`)
        - output: same as the input
        """
        return self.apply(x, 0)

    def apply(self, x, start: int = 0, positions=None):
        """Rotary encoding of positions `start .. start + seq_length`, or of each row's own
        `positions` (int `[batch_size, seq_length]`, a Tensor or array: packed sequences whose
        positions restart at 0) for `x` `[batch_size, seq_length, d_model]` or
        `[batch_size, heads, seq_length, d_model]`."""
        assert_shape(x, [..., None, self.d_model])
        check_float(self, x, name="x")
        seq_length = x.dims()[-2]
        if positions is not None:
            return self._apply_positions(x, positions)
        if start + seq_length > self.max_sequence_length:
            raise ValueError(
                f"RotaryEncoding: positions {start}..{start + seq_length} exceed max_sequence_length "
                f"{self.max_sequence_length}"
            )
        cos, sin = self.frequencies(x.device, start + seq_length)
        return _ops.rotary(x, cos[start:start + seq_length], sin[start:start + seq_length])

    def _apply_positions(self, x, positions):
        pos = np.asarray(positions.numpy() if isinstance(positions, Tensor) else positions)
        batch_size, seq_length = x.dims()[0], x.dims()[-2]
        if x.rank not in (3, 4) or pos.shape != (batch_size, seq_length) or pos.dtype.kind not in "iu":
            raise ValueError(f"RotaryEncoding: positions must be int [batch_size {batch_size}, seq_length "
                             f"{seq_length}] for x [batch_size, (heads,) seq_length, d_model], found "
                             f"{pos.dtype} {list(pos.shape)} for x {list(x.dims())}")
        top = int(pos.max()) + 1 if pos.size else 0
        if pos.size and (int(pos.min()) < 0 or top > self.max_sequence_length):
            raise ValueError(f"RotaryEncoding: positions {int(pos.min())}..{top - 1} are outside 0.."
                             f"{self.max_sequence_length - 1} (max_sequence_length {self.max_sequence_length})")
        cos, sin = self.frequencies(x.device, top)
        idx = x.device.xp.asarray(pos.astype(np.int64))
        c, s = cos[idx], sin[idx]  # [batch_size, seq_length, d_model / 2]
        if x.rank == 4:  # one angle per position for every head
            c, s = c[:, None], s[:, None]
        return _ops.rotary(x, c, s)

    def custom_content(self, content):
        return content.add("d_model", self.d_model).add("max_sequence_length", self.max_sequence_length).optional()


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _positional_shape(m, ins, ctx):
    t = ins[0]
    _, max_sequence_size, d_model = m.sinusoids.shape
    expect("assert_shape(input, [None, None, d_model])", t, [None, None, d_model])
    float_input("PositionalEncoding", t)
    seq = t.dims[1]
    ctx.require(seq, "max", max_sequence_size, lambda: (f"max_sequence_size({max_sequence_size}) must be greater "
                                                        f"or equal than length({seq})"))
    return same(t)


def _rotary_shape(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(x, [..., None, self.d_model])", t, [..., None, m.d_model])
    float_input("RotaryEncoding", t, "x")
    seq = t.dims[-2]
    ctx.require(seq, "max", m.max_sequence_length, lambda: (f"RotaryEncoding: positions 0..{seq} exceed "
                                                            f"max_sequence_length {m.max_sequence_length}"))
    return same(t)


declare(PositionalEncoding, shape=_positional_shape)
declare(RotaryEncoding, shape=_rotary_shape)
declare(PositionalEncoding, burn=Burn(""))
