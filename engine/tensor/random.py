"""Random distributions drawn from a device's own generator."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Distribution:
    """Burn's `Distribution`: Default (uniform [0, 1)), Uniform(low, high), Normal(mean, std), Bernoulli(p)."""

    kind: str
    a: float = 0.0
    b: float = 1.0

    @staticmethod
    def default() -> "Distribution":
        return Distribution("uniform", 0.0, 1.0)

    @staticmethod
    def uniform(low: float, high: float) -> "Distribution":
        if not low <= high:
            raise ValueError(f"Distribution.uniform: expected low <= high, got low={low}, high={high}")
        return Distribution("uniform", float(low), float(high))

    @staticmethod
    def normal(mean: float, std: float) -> "Distribution":
        if std < 0:
            raise ValueError(f"Distribution.normal: expected std >= 0, got {std}")
        return Distribution("normal", float(mean), float(std))

    @staticmethod
    def bernoulli(p: float) -> "Distribution":
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Distribution.bernoulli: expected 0 <= p <= 1, got {p}")
        return Distribution("bernoulli", float(p))

    @staticmethod
    def parse(spec) -> "Distribution":
        if isinstance(spec, Distribution):
            return spec
        if spec in (None, "default"):
            return Distribution.default()
        if isinstance(spec, tuple) and spec and spec[0] in ("uniform", "normal", "bernoulli"):
            return getattr(Distribution, spec[0])(*spec[1:])
        raise ValueError(
            f"unknown distribution {spec!r}: expected 'default', a Distribution, or "
            "('uniform', low, high) / ('normal', mean, std) / ('bernoulli', p)"
        )

    def sample(self, device, shape, dtype):
        rng = device.rng
        if self.kind == "uniform":
            if dtype.kind == "float" and dtype.np.itemsize >= 4:
                arr = rng.random(shape, dtype=dtype.np)
            else:
                arr = rng.random(shape)
            if (self.a, self.b) != (0.0, 1.0):
                arr = arr * (self.b - self.a) + self.a
        elif self.kind == "normal":
            if dtype.kind == "float" and dtype.np.itemsize >= 4:
                arr = rng.standard_normal(shape, dtype=dtype.np)
            else:
                arr = rng.standard_normal(shape)
            if (self.a, self.b) != (0.0, 1.0):
                arr = arr * self.b + self.a
        else:
            arr = rng.random(shape) < self.a
        return arr.astype(dtype.np, copy=False)
