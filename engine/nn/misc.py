"""GaussianNoise, CosineSimilarity, PairwiseDistance, PixelShuffle, PixelUnshuffle, Identity."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..tensor import Tensor
from ._base import Config, Flag, Layer, Module, assert_shape, f64
from ..shapes.rules import RuleError, Shape, dims_text, elementwise, expect, rows_like, same
from .spec import declare

__all__ = [
    "GaussianNoiseConfig",
    "GaussianNoise",
    "CosineSimilarityConfig",
    "CosineSimilarity",
    "cosine_similarity",
    "PairwiseDistanceConfig",
    "PairwiseDistance",
    "lp_norm",
    "PixelShuffleConfig",
    "PixelShuffle",
    "PixelUnshuffleConfig",
    "PixelUnshuffle",
    "Identity",
]


class Identity(Module):
    """Returns its input unchanged."""

    def __init__(self):
        super().__init__()

    def forward(self, input):
        """Forward pass, returns the input tensor.

        # Shapes

        - input: `[...]`
        - output: `[...]`
        """
        assert_shape(input, [...])
        return input


# ---------------------------------------------------------------------- GaussianNoise
@dataclass
class GaussianNoiseConfig(Config):
    """Configuration of a [`GaussianNoise`] layer."""

    std: float

    def init(self, device=None) -> "GaussianNoise":
        if math.copysign(1.0, self.std) < 0:
            raise ValueError(f"Standard deviation is required to be non-negative, but got {f64(self.std)}")
        return GaussianNoise(self.std)


class GaussianNoise(Layer):
    """Adds `N(0, std)` noise while training (the training flag on and an autodiff input)."""

    def __init__(self, std: float):
        super().__init__()
        self.std = float(std)
        self.training = Flag(True)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[..., any]`
        - output: `[..., any]`
        """
        assert_shape(input, [None, ...])
        if not self.training or self.std == 0.0 or not input.is_autodiff():
            return input
        noise = Tensor.random(input.shape, ("normal", 0.0, self.std), device=input.device, dtype=input.dtype)
        return input + noise

    def custom_content(self, content):
        return content.add("std", self.std).optional()


# ---------------------------------------------------------------------- distances
def _dim(dim: int, rank: int, owner: str) -> int:
    d = dim + rank if dim < 0 else dim
    if not 0 <= d < rank:
        raise ValueError(f"{owner}: dim {dim} is out of range for inputs of rank {rank}")
    return d


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8):
    """`sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps))` along `dim` (kept, of size 1)."""
    dot = (x1 * x2).sum(dim, keepdim=True)
    n1 = (x1 * x1).sum(dim, keepdim=True).sqrt().clamp_min(eps)
    n2 = (x2 * x2).sum(dim, keepdim=True).sqrt().clamp_min(eps)
    return dot / (n1 * n2)


def lp_norm(x, p: float, dim: int):
    """The p-norm along `dim` (kept, of size 1)."""
    if p == 2.0:
        return (x * x).sum(dim, keepdim=True).sqrt()
    if p == 1.0:
        return x.abs().sum(dim, keepdim=True)
    if p == float("inf"):
        return x.abs().max(dim, keepdim=True)
    return x.abs().powf(p).sum(dim, keepdim=True).powf(1.0 / p)


@dataclass
class CosineSimilarityConfig(Config):
    """Configuration of a [`CosineSimilarity`] layer."""

    dim: int = 1
    eps: float = 1e-8

    def init(self, device=None) -> "CosineSimilarity":
        return CosineSimilarity(self.dim, self.eps)


class CosineSimilarity(Layer):
    """Cosine similarity of two tensors along `dim` (reduced in the output)."""

    def __init__(self, dim: int = 1, eps: float = 1e-8):
        super().__init__()
        self.dim = int(dim)
        self.eps = float(eps)

    def forward(self, x1, x2):
        """Applies the forward pass, computing one similarity per row.

        # Shapes

        - x1: `[batch_size, features]`
        - x2: `[batch_size, features]`
        - output: `[batch_size]`
        """
        assert_shape(x1, [None, None])
        batch_size, features = x1.dims()
        assert_shape(x2, [batch_size, features])
        d = _dim(self.dim, 2, "CosineSimilarity")
        return cosine_similarity(x1, x2, d, self.eps).squeeze(d)

    def custom_content(self, content):
        return content.add("dim", self.dim).add("eps", self.eps).optional()


@dataclass
class PairwiseDistanceConfig(Config):
    """Configuration of a [`PairwiseDistance`] layer."""

    p: float = 2.0
    eps: float = 1e-6

    def init(self, device=None) -> "PairwiseDistance":
        return PairwiseDistance(self.p, self.eps)


class PairwiseDistance(Layer):
    """`||x1 - x2 + eps||_p` per row, over the feature dim."""

    def __init__(self, p: float = 2.0, eps: float = 1e-6):
        super().__init__()
        self.p = float(p)
        self.eps = float(eps)

    def forward(self, x1, x2):
        """Applies the forward pass, computing one distance per row.

        # Shapes

        - x1: `[batch_size, features]`
        - x2: `[batch_size, features]`
        - output: `[batch_size]`
        """
        assert_shape(x1, [None, None])
        batch_size, features = x1.dims()
        assert_shape(x2, [batch_size, features])
        return lp_norm((x1 - x2) + self.eps, self.p, 1).squeeze(1)

    def custom_content(self, content):
        return content.add("p", self.p).add("eps", self.eps).optional()


# ---------------------------------------------------------------------- pixel shuffle
@dataclass
class PixelShuffleConfig(Config):
    """Configuration of a [`PixelShuffle`] layer."""

    upscale_factor: int

    def init(self, device=None) -> "PixelShuffle":
        return PixelShuffle(self.upscale_factor)


class PixelShuffle(Layer):
    """`[N, C * r^2, H, W]` to `[N, C, H * r, W * r]` (r the upscale factor)."""

    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = int(upscale_factor)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels * upscale_factor^2, height, width]`
        - output: `[batch_size, channels, height * upscale_factor, width * upscale_factor]`
        """
        assert_shape(input, [None, None, None, None])
        r = self.upscale_factor
        if r <= 0:
            raise ValueError("PixelShuffle: upscale_factor must be greater than 0")
        b, c, h, w = input.dims()
        if c % (r * r):
            raise ValueError(
                f"PixelShuffle: input channels ({c}) must be divisible by upscale_factor^2 ({r * r}) "
                f"(dims {list(input.shape)})"
            )
        oc = c // (r * r)
        return input.reshape(b, oc, r, r, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, oc, h * r, w * r)

    def custom_content(self, content):
        return content.add("upscale_factor", self.upscale_factor).optional()


@dataclass
class PixelUnshuffleConfig(Config):
    """Configuration of a [`PixelUnshuffle`] layer."""

    downscale_factor: int

    def init(self, device=None) -> "PixelUnshuffle":
        return PixelUnshuffle(self.downscale_factor)


class PixelUnshuffle(Layer):
    """`[N, C, H * r, W * r]` to `[N, C * r^2, H, W]`, the inverse of [`PixelShuffle`]."""

    def __init__(self, downscale_factor: int):
        super().__init__()
        self.downscale_factor = int(downscale_factor)

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, channels, height * downscale_factor, width * downscale_factor]`
        - output: `[batch_size, channels * downscale_factor^2, height, width]`
        """
        assert_shape(input, [None, None, None, None])
        r = self.downscale_factor
        if r <= 0:
            raise ValueError("PixelUnshuffle: downscale_factor must be greater than 0")
        b, c, h, w = input.dims()
        if h % r:
            raise ValueError(f"PixelUnshuffle: input height ({h}) must be divisible by downscale_factor ({r})")
        if w % r:
            raise ValueError(f"PixelUnshuffle: input width ({w}) must be divisible by downscale_factor ({r})")
        oh, ow = h // r, w // r
        return input.reshape(b, c, oh, r, ow, r).permute(0, 1, 3, 5, 2, 4).reshape(b, c * r * r, oh, ow)

    def custom_content(self, content):
        return content.add("downscale_factor", self.downscale_factor).optional()


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _identity_shape(m, ins, ctx):
    expect("assert_shape(input, [...])", ins[0], [...])
    return same(ins[0])


def _cosine_similarity_shape(m, ins, ctx):
    dims = rows_like(("x1", "x2"), ins, "features")
    d = m.dim + 2 if m.dim < 0 else m.dim
    if not 0 <= d < 2:
        raise RuleError(f"CosineSimilarity: dim {m.dim} is out of range for inputs of rank 2")
    return Shape((dims[1 - d],))


def _pairwise_distance_shape(m, ins, ctx):
    batch_size, _ = rows_like(("x1", "x2"), ins, "features")
    return Shape((batch_size,))


def _pixel_shuffle_shape(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, None, None, None])", t, [None, None, None, None])
    r = m.upscale_factor
    if r <= 0:
        raise RuleError("PixelShuffle: upscale_factor must be greater than 0")
    b, c, h, w = t.dims
    ctx.require(c, "multiple", r * r, lambda: f"PixelShuffle: input channels ({c}) must be divisible by "
                                              f"upscale_factor^2 ({r * r}) (dims {dims_text(t.dims)})")
    return Shape((b, c // (r * r), h * r, w * r), t.dtype)


def _pixel_unshuffle_shape(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, None, None, None])", t, [None, None, None, None])
    r = m.downscale_factor
    if r <= 0:
        raise RuleError("PixelUnshuffle: downscale_factor must be greater than 0")
    b, c, h, w = t.dims
    ctx.require(h, "multiple", r, lambda: f"PixelUnshuffle: input height ({h}) must be divisible by "
                                          f"downscale_factor ({r})")
    ctx.require(w, "multiple", r, lambda: f"PixelUnshuffle: input width ({w}) must be divisible by "
                                          f"downscale_factor ({r})")
    return Shape((b, c * (r * r), h // r, w // r), t.dtype)


declare(GaussianNoise, shape=elementwise)
declare(Identity, shape=_identity_shape)
declare(CosineSimilarity, shape=_cosine_similarity_shape)
declare(PairwiseDistance, shape=_pairwise_distance_shape)
declare(PixelShuffle, shape=_pixel_shuffle_shape)
declare(PixelUnshuffle, shape=_pixel_unshuffle_shape)
