"""A weight kept in llama.cpp's blocks: read from its GGUF file at first use, dequantized per use.

`GGUFWeight` is a `Reparameterization` that stores its base (`STORES_BASE`, as QLoRA's NF4
adapter does): the parameter's own base is a zero placeholder of the logical shape (a zero-stride
view, no memory), and the value `Param.val()` returns is the dequantization of the stored blocks,
computed each time a computation asks for it, as a constant (no gradient flows into it). The
blocks are one `uint8` parameter, `[rows, bytes per row]` in the file's row order after the
rule's row permutation (a permutation of whole rows moves whole blocks, so it is done once on the
bytes), lazy: nothing is read until the weight is first used. In a record:

    layers.0.mlp.up_proj.weight                    the placeholder (not in records)
    layers.0.mlp.up_proj.weight.gguf.blocks.data   U8 [rows, bytes per row]

Dequantization is `gguf.quants.dequantize`, llama.cpp's own reference: the values are its values,
bit for bit. LoRA, rsLoRA and DoRA attach over a GGUF weight as QLoRA's factors over its NF4
weight (`Module.apply_lora`: `TAKES_ADAPTER`): the adapter keeps the blocks (`….lora.gguf.blocks.data`)
and its value is the dequantized weight with the adapter's change, the factors trained in float32
and the blocks left as the file had them. A transposed rule (a Linear's `[in, out]` from the stored `[out, in]`) gives a
transposed view of the dequantized rows.

Computing with it (`MULTIPLIES`): a Linear, the tied head and generation's head ask the weight
for `matmul(x)` and an Embedding for `rows(indices)` (engine.nn's `multiplied`, `looked_up`)
before they ask for its value, and the weight multiplies in its blocks with the CPU door's
compiled kernels (`engine.tensor.cpu.quant`: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K), equal to
dequantize-then-multiply within float32 rounding; the input's gradient is the blocks' product too.
LoRA and rsLoRA over it add the factors' product (`(x a) b scale`); DoRA, the other types and a
GPU read the value (dequantized per use, in slices of rows; the graph keeps the blocks, not the
value: the backward computes it again, `engine.tensor.recompute`). Generation keeps these weights as they are (it folds
the other adapters), so no float32 copy of a weight is held.
"""
from __future__ import annotations

import numpy as np

from ..module import Module, Param
from ..module.lora import DoraAdapter, LoraAdapter, RsLoraAdapter
from ..module.reparam import Reparameterization, ReparameterizationError, iter_param_slots
from ..autodiff import no_recording
from ..tensor import Tensor, cpu
from ..tensor.raw import array, recomputable, record, tracking, untracked

__all__ = ["GGUFBlocks", "GGUFDoraAdapter", "GGUFLoraAdapter", "GGUFRsLoraAdapter", "GGUFWeight",
           "dequantize_blocks", "dequantized_bases"]


def dequantize_blocks(blocks: np.ndarray, qtype: str) -> np.ndarray:
    """float32 values of `blocks` (uint8 `[rows, bytes per row]`) of ggml type `qtype`, as
    `gguf.quants.dequantize` computes them: `[rows, values per row]`."""
    import gguf  # noqa: PLC0415 - imported with the first GGUF weight used

    if not isinstance(blocks, np.ndarray) and hasattr(blocks, "get"):  # CuPy: gguf's reference runs on the host
        blocks = blocks.get()
    blocks, kind = np.asarray(blocks), gguf.GGMLQuantizationType[qtype]
    if blocks.ndim != 2 or blocks.shape[0] * blocks.shape[1] <= _CHUNK_BYTES:
        out = gguf.quants.dequantize(blocks, kind)
        return out if out.dtype == np.float32 else out.astype(np.float32)
    # in slices of rows: the reference's temporaries (several arrays of the values' size) stay small
    step = max(1, _CHUNK_BYTES // blocks.shape[1])
    first = gguf.quants.dequantize(blocks[:step], kind)
    out = np.empty((blocks.shape[0],) + first.shape[1:], np.float32)
    out[:step] = first
    for start in range(step, blocks.shape[0], step):
        out[start:start + step] = gguf.quants.dequantize(blocks[start:start + step], kind)
    return out


_CHUNK_BYTES = 1 << 20  # bytes of blocks dequantized at once


class GGUFBlocks(Module):
    """The stored blocks of one weight (`data`, uint8, never trainable) and their ggml type."""

    # the bytes stand for the weight, which is counted already (engine.module.summary)
    PACKED_STORAGE = True

    def __init__(self, data: Param, qtype: str):
        self.data = data
        self.qtype = str(qtype)


class GGUFWeight(Reparameterization):
    """A weight kept quantized (see this file's doc): `blocks`, the stored `rows` x `cols` shape
    (NumPy order), whether the parameter is its transpose, and the float dtype it computes in."""

    NAME = "gguf"
    STORES_BASE = True

    def __init__(self, blocks: GGUFBlocks, stored_shape, transpose: bool, dtype: str = "float32"):
        self.blocks = blocks
        self.stored_shape = tuple(int(s) for s in stored_shape)
        self.transpose = bool(transpose)
        self.dtype = str(dtype)

    @property
    def qtype(self) -> str:
        return self.blocks.qtype

    def nbytes(self) -> int:
        """The bytes the blocks take (what the weight holds in memory once read)."""
        return self.blocks.data.numel()

    def dequantized(self) -> np.ndarray:
        """The weight's values as a NumPy array of the parameter's shape (float32)."""
        values = dequantize_blocks(array(self.blocks.data.val()), self.qtype).reshape(self.stored_shape)
        return values.T if self.transpose else values

    def base(self) -> Tensor:
        data = self.blocks.data.val()
        return Tensor.from_data(self.dequantized(), device=data.device, dtype=self.dtype)

    def apply(self, base: Tensor) -> Tensor:
        dense = self._recomputed(self.base)
        if base is not None and tuple(base.shape) != tuple(dense.shape):
            raise ValueError(f"GGUFWeight.apply: the parameter's base has dims {list(base.shape)}, the stored "
                             f"weight {list(dense.shape)}")
        return dense

    @staticmethod
    def _recomputed(value) -> Tensor:
        """`value()`, marked as computed again from the blocks in the backward rather than kept by the
        graph until then (engine.tensor.recompute): the tape holds the blocks, not a float copy."""
        def again():
            with no_recording():
                return array(value())
        return recomputable(value(), again)

    # ------------------------------------------------------------------ products (the compute path)
    # A layer whose weight's reparameterization sets MULTIPLIES asks it for `matmul(x, transposed)`
    # (Linear, the tied head) and `rows(indices)` (Embedding) before it asks for the value: the
    # weight is multiplied in its blocks and never unpacked whole (engine.tensor.cpu.quant).
    MULTIPLIES = True

    def _stored(self):
        data = array(self.blocks.data.val())
        return data if isinstance(data, np.ndarray) else None

    def matmul(self, x: Tensor, transposed: bool = False) -> Tensor | None:
        """`x @ value` (`x @ value.T` when `transposed`) computed from the blocks, the weight a
        constant (the gradient reaches `x` only); None where there is no kernel for it (the caller
        then multiplies by the dequantized value)."""
        if self.dtype != "float32" or x.dtype != "float32":
            return None
        blocks = self._stored()
        rows, k = self.stored_shape
        if blocks is None or not cpu.quant.supported(blocks, self.qtype, k):
            return None
        xd = array(x)
        by_rows = self.transpose != bool(transposed)  # x @ V.T over the stored rows V, else x @ V
        width = k if by_rows else rows
        if xd.ndim == 0 or xd.shape[-1] != width:
            return None
        x2 = xd.reshape(-1, width)
        out2 = (cpu.quant.rows_product(x2, blocks, self.qtype, k) if by_rows
                else cpu.quant.product(x2, blocks, self.qtype, k))
        out = out2.reshape(xd.shape[:-1] + (out2.shape[1],))
        if not tracking(x):
            return untracked(out, (x,))
        xshape = xd.shape

        def rule(g):
            g2 = g.reshape(-1, g.shape[-1])
            gx = (cpu.quant.product(g2, blocks, self.qtype, k) if by_rows
                  else cpu.quant.rows_product(g2, blocks, self.qtype, k))
            return (gx.reshape(xshape),)

        return record(out, x.device, (x,), rule, "gguf_matmul")

    def empty_value(self) -> Tensor:
        """An empty tensor of the value's dtype and device (what a layer checks its input's dtype
        against without unpacking the weight)."""
        data = self.blocks.data.val()
        return Tensor.from_data(np.zeros((0,), dtype=np.float32), device=data.device, dtype=self.dtype)

    def rows(self, indices) -> Tensor | None:
        """The value's rows at the int array `indices` (`[..., cols]`, an embedding's lookup),
        dequantized alone, bit for bit gguf's; None for a transposed weight or on a GPU."""
        blocks = self._stored()
        if self.transpose or blocks is None:
            return None
        rows, k = self.stored_shape
        idx = np.asarray(indices)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= rows):
            bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
            raise IndexError(f"embedding: index {bad} is out of range for {rows} embeddings "
                             f"(expected 0 <= index < {rows})")
        flat = idx.reshape(-1).astype(np.int64)
        values = cpu.quant.dequantize(blocks, self.qtype, k, flat)
        if values is None:
            values = dequantize_blocks(blocks[flat], self.qtype)
        data = self.blocks.data.val()
        return Tensor.from_data(values.reshape(idx.shape + (k,)), device=data.device, dtype=self.dtype)

    # LoRA attaches over it (engine.module.reparam: the stored base takes an adapter)
    TAKES_ADAPTER = True

    def with_adapter(self, adapter) -> Reparameterization:
        """The adapter (LoRA, rsLoRA or DoRA) over this weight, the blocks kept (see this file's doc)."""
        cls = _OVER_GGUF.get(type(adapter))
        if cls is None:
            kind = "a QLoRA adapter (it would quantize the weight again)" if getattr(adapter, "STORES_BASE", False) \
                else f"a {type(adapter).__name__}"
            raise ReparameterizationError(f"a GGUF weight kept quantized ({self.qtype}) takes LoRA, rsLoRA or DoRA, "
                                          f"not {kind}")
        out = cls.__new__(cls)
        out.__dict__.update(adapter.__dict__)
        out.gguf = self
        return out


class _OverGGUF:
    """An adapter whose base is a `GGUFWeight` it holds (`gguf`): the parameter's own base is the
    placeholder, the value the dequantized weight with the adapter's change."""

    STORES_BASE = True

    def base(self) -> Tensor:
        return self.gguf.base()

    def apply(self, base: Tensor) -> Tensor:
        # the adapted weight is computed again (the blocks dequantized, the factors' change added)
        return self.gguf._recomputed(lambda: super(_OverGGUF, self).apply(self.gguf.base()))


class _LowRankOverGGUF(_OverGGUF):
    """LoRA / rsLoRA over a GGUF weight: `x @ (W + scale a b)` as the blocks' product plus the
    factors' (`(x a) b scale`), W never unpacked whole."""

    MULTIPLIES = True

    def matmul(self, x: Tensor, transposed: bool = False) -> Tensor | None:
        base = self.gguf.matmul(x, transposed)
        if base is None:
            return None
        a, b = self.a.val(), self.b.val()
        low = (x @ b.transpose()) @ a.transpose() if transposed else (x @ a) @ b
        return base + low * self.scale

    def empty_value(self) -> Tensor:
        return self.gguf.empty_value()

    def rows(self, indices) -> Tensor | None:
        return None  # an embedding's adapter: its value is read whole (LoraAdapter.apply)


class GGUFLoraAdapter(_LowRankOverGGUF, LoraAdapter):
    """LoRA over a GGUF weight kept quantized."""

    NAME = "lora"


class GGUFRsLoraAdapter(_LowRankOverGGUF, RsLoraAdapter):
    """rsLoRA over a GGUF weight kept quantized."""

    NAME = "lora"


class GGUFDoraAdapter(_OverGGUF, DoraAdapter):
    """DoRA over a GGUF weight kept quantized (the magnitudes start at the dequantized weight's norms)."""

    NAME = "lora"


_OVER_GGUF = {LoraAdapter: GGUFLoraAdapter, RsLoraAdapter: GGUFRsLoraAdapter, DoraAdapter: GGUFDoraAdapter}


def _dequantize_init(weight: GGUFWeight):
    def init(device, require_grad):
        value = Tensor.from_data(weight.dequantized(), device=device, dtype=weight.dtype)
        return value.require_grad() if require_grad else value
    return init


def dequantized_bases(model: Module) -> Module:
    """`model` with every weight kept in GGUF blocks (and no adapter over it) as a plain lazy
    parameter whose value is its dequantization, computed when first used: what a Hugging Face
    folder or a record of plain weights holds. Adapters over GGUF weights are left as they are."""
    out = model
    for path, p in list(iter_param_slots(model)):
        r = p.reparameterization
        if isinstance(r, GGUFWeight):
            plain = Param.uninitialized(_dequantize_init(r), p.lazy_device(), False, tuple(p.shape), id=p.id)
            out = out.with_child(path, plain)
    return out
