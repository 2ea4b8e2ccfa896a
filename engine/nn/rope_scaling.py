"""Long-context frequency scalings of a rotary encoding, as transformers defines them: YaRN
(`rope_type: "yarn"`), dynamic NTK (`"dynamic"`) and LongRoPE (`"longrope"`, Phi-3).

A scaling is called on the float32 inverse frequencies `theta^(-2i / d)` of a `RotaryEncoding`
and returns the ones used. Beyond that (`RotaryEncoding` reads these when present):

- `attention_factor` (float): cos and sin are multiplied by it (YaRN's and LongRoPE's
  attention scaling: every query-key score grows by its square);
- `variant(seq_len)`: which table serves a call whose highest position is `seq_len - 1`
  (`seq_len` None: the table at initialization); `at_length(inv_freq, seq_len)` the inverse
  frequencies of that table. Dynamic NTK and LongRoPE change with the length of each call, as
  transformers' `dynamic_rope_update` does: positions already in a key/value cache keep the
  rotation they were given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["YarnRopeScaling", "DynamicNtkRopeScaling", "LongRopeScaling"]


def _positive(owner, **values):
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
            raise ValueError(f"{owner}: {name} must be a positive number, got {v!r}")


def _dim(inv_freq) -> int:
    return 2 * np.asarray(inv_freq).shape[-1]


def _base_powers(theta: float, dim: int) -> np.ndarray:
    """`theta ** (2i / dim)` in float32, as torch computes `base ** (arange(0, dim, 2).float() / dim)`."""
    exponent = (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)).astype(np.float32)
    return np.power(np.float32(theta), exponent, dtype=np.float32)


@dataclass(frozen=True)
class YarnRopeScaling:
    """YaRN: frequencies blended between interpolated (divided by `factor`) and kept, by a linear
    ramp between the dims that turn `beta_fast` and `beta_slow` times over
    `original_max_position_embeddings`; cos / sin scaled by `attention_factor` (default
    `0.1 ln(factor) + 1`, or the ratio of the two with `mscale` and `mscale_all_dim`)."""

    theta: float
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor_: float | None = None
    truncate: bool = True

    def __post_init__(self):
        _positive("YarnRopeScaling", theta=self.theta, factor=self.factor, beta_fast=self.beta_fast,
                  beta_slow=self.beta_slow, original_max_position_embeddings=self.original_max_position_embeddings)

    @property
    def attention_factor(self) -> float:
        if self.attention_factor_ is not None:
            return float(self.attention_factor_)

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        if self.mscale and self.mscale_all_dim:
            return float(get_mscale(self.factor, self.mscale) / get_mscale(self.factor, self.mscale_all_dim))
        return get_mscale(self.factor)

    def __call__(self, inv_freq):
        dim = _dim(inv_freq)
        base, old = float(self.theta), float(self.original_max_position_embeddings)

        def correction_dim(rotations):
            return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))
        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # transformers' guard against a zero-width ramp
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
        extrapolation = (np.float32(1) - ramp.astype(np.float32)).astype(np.float32)
        pos = _base_powers(base, dim)
        inv_extra = (np.float32(1) / pos).astype(np.float32)
        inv_inter = (np.float32(1) / (np.float32(self.factor) * pos)).astype(np.float32)
        return (inv_inter * (np.float32(1) - extrapolation) + inv_extra * extrapolation).astype(np.float32)


@dataclass(frozen=True)
class DynamicNtkRopeScaling:
    """Dynamic NTK: for a call reaching `seq_len > max_position_embeddings` positions the base
    becomes `theta * (factor * seq_len / max_position_embeddings - (factor - 1)) ** (d / (d - 2))`;
    shorter calls use the plain frequencies."""

    theta: float
    factor: float
    max_position_embeddings: int

    def __post_init__(self):
        _positive("DynamicNtkRopeScaling", theta=self.theta, factor=self.factor,
                  max_position_embeddings=self.max_position_embeddings)

    def __call__(self, inv_freq):
        return np.asarray(inv_freq, dtype=np.float32)

    def variant(self, seq_len):
        return None if seq_len is None or seq_len <= self.max_position_embeddings else int(seq_len)

    def at_length(self, inv_freq, seq_len):
        if self.variant(seq_len) is None:
            return np.asarray(inv_freq, dtype=np.float32)
        dim = _dim(inv_freq)
        f32 = np.float32
        grow = (f32(self.factor) * f32(seq_len) / f32(self.max_position_embeddings) - f32(self.factor - 1))
        base = f32(self.theta) * np.power(f32(grow), f32(dim / (dim - 2)), dtype=np.float32)
        return (f32(1) / _base_powers(float(base), dim)).astype(np.float32)


@dataclass(frozen=True)
class LongRopeScaling:
    """LongRoPE (Phi-3): per-frequency divisors, `short_factor` while a call's positions stay within
    `original_max_position_embeddings` and `long_factor` beyond; cos / sin scaled by
    `attention_factor` (default `sqrt(1 + ln(factor) / ln(original_max_position_embeddings))`,
    `factor` defaulting to `max_position_embeddings / original_max_position_embeddings`)."""

    theta: float
    short_factor: tuple
    long_factor: tuple
    original_max_position_embeddings: int
    max_position_embeddings: int
    factor: float | None = None
    attention_factor_: float | None = None

    def __post_init__(self):
        _positive("LongRopeScaling", theta=self.theta, original_max_position_embeddings=self.original_max_position_embeddings,
                  max_position_embeddings=self.max_position_embeddings)
        for name in ("short_factor", "long_factor"):
            values = getattr(self, name)
            for v in values:
                _positive("LongRopeScaling", **{name: v})
        if len(self.short_factor) != len(self.long_factor):
            raise ValueError(f"LongRopeScaling: short_factor and long_factor must have one value per frequency, got "
                             f"{len(self.short_factor)} and {len(self.long_factor)}")

    @property
    def attention_factor(self) -> float:
        if self.attention_factor_ is not None:
            return float(self.attention_factor_)
        factor = self.factor if self.factor is not None else \
            self.max_position_embeddings / self.original_max_position_embeddings
        if factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(factor) / math.log(self.original_max_position_embeddings))

    def __call__(self, inv_freq):
        return self.at_length(inv_freq, None)

    def variant(self, seq_len):
        return "long" if seq_len is not None and seq_len > self.original_max_position_embeddings else None

    def at_length(self, inv_freq, seq_len):
        dim = _dim(inv_freq)
        ext = np.asarray(self.long_factor if self.variant(seq_len) else self.short_factor, dtype=np.float32)
        if ext.shape != (dim // 2,):
            raise ValueError(f"LongRopeScaling: {len(ext)} factors for {dim // 2} frequencies (head_dim {dim})")
        return (np.float32(1) / (ext * _base_powers(self.theta, dim))).astype(np.float32)
