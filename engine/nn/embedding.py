"""Embedding: a lookup table of `n_embedding` vectors of size `d_model`."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..tensor import DTypeError, Tensor, TensorError
from ..tensor.raw import array, record
from ._base import Config, Layer, assert_shape, check_indices, init_with, initializers, looked_up
from ..shapes.dims import as_dim
from ..shapes.rules import NP_DTYPE, RuleError, Shape, dims_text, expect
from .spec import Burn, declare

__all__ = ["EmbeddingConfig", "Embedding", "embedding"]


@dataclass
class EmbeddingConfig(Config):
    """Configuration of an [`Embedding`] layer; weights start from `Normal(0, 1)`."""

    n_embedding: int
    d_model: int
    initializer: object = field(default_factory=lambda: initializers.Normal(mean=0.0, std=1.0))

    def init(self, device=None) -> "Embedding":
        weight = init_with(self.initializer, (self.n_embedding, self.d_model), None, None, device)
        return Embedding(weight)


def embedding(weight: Tensor, indices: Tensor) -> Tensor:
    """Rows of `weight` `[n, d]` picked by the int tensor `indices` `[...]`: `[..., d]`."""
    op = "embedding"
    if indices.kind != "int":
        raise DTypeError(f"{op}: expected an int tensor of indices, got {indices.dtype} (dims {list(indices.shape)})")
    idx = array(indices)
    n, d = weight.shape
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
        raise TensorError(f"{op}: index {bad} is out of range for {n} embeddings (expected 0 <= index < {n})")
    wd = array(weight)
    out = wd[idx]
    xp = weight.device.xp

    def rule(g):
        gw = xp.zeros_like(wd)
        flat = idx.reshape(-1)
        order = xp.argsort(flat, kind="stable")
        sidx = flat[order]
        rows = g.reshape(-1, d)[order]
        if sidx.size:
            starts = xp.concatenate([xp.asarray([0]), xp.nonzero(sidx[1:] != sidx[:-1])[0] + 1])
            if xp is __import__("numpy"):
                gw[sidx[starts]] = xp.add.reduceat(rows, starts, axis=0)
            else:  # CuPy has no reduceat
                import cupyx  # noqa: PLC0415

                cupyx.scatter_add(gw, flat, g.reshape(-1, d))
        return (gw,)

    return record(out, weight.device, (weight,), rule, op)


class Embedding(Layer):
    """Lookup table of `n_embedding` vectors; `weight` is `[n_embedding, d_model]`."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, input):
        """Applies the forward pass on the input tensor.

        # Shapes

        - input: `[batch_size, seq_length]`
        - output: `[batch_size, seq_length, d_model]`
        """
        assert_shape(input, [None, None])
        check_indices(self, input)
        rows = looked_up(self.weight, input)
        if rows is not None:  # a weight kept quantized: only the rows looked up are unpacked
            return rows
        return embedding(self.weight.val(), input)

    def custom_content(self, content):
        n_embedding, d_model = self.weight.shape
        return content.add("n_embedding", n_embedding).add("d_model", d_model).optional()


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _embedding_shape(m, ins, ctx):
    t = ins[0]
    expect("assert_shape(input, [None, None])", t, [None, None])
    if t.dtype == "float" or t.dtype == "bool":
        raise RuleError(f"Embedding: expected an int tensor of indices, got {NP_DTYPE[t.dtype]} (input dims "
                        f"{dims_text(t.dims)}); convert the input with input.cast(\"int64\")")
    _, d_model = m.weight.shape
    return Shape(t.dims + (as_dim(d_model),))


declare(Embedding, shape=_embedding_shape)
declare(Embedding, burn=Burn(""))
