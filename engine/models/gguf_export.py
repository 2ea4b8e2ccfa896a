"""`save_gguf`: a model written as a GGUF file llama.cpp (and Ollama, LM Studio) loads and runs.

The model is the merged one: every parameter's value as the model computes it (a LoRA, rsLoRA or
DoRA over a weight is folded into it; a weight kept in GGUF blocks is dequantized, unless it is
written back in its own type unchanged, when its blocks are copied as they are). Each tensor is
written under llama.cpp's name and in its layout by `gguf_weight_map`'s rules inverted: a "llama"
file's q/k rows in llama.cpp's interleaved rotary order (Ember's own order), the other architectures'
in Hugging Face's order (NEOX rotary); Gemma's norms as `1 + w`. The parameters of one tensor are
joined: Phi-3's q, k, v rows into `attn_qkv` and gate, up rows into `ffn_up`; a layer's experts
stacked into `ffn_{gate,up,down}_exps` `[experts, rows, cols]` (their blocks copied as they are when
every expert is unchanged in its source type). The architectures and what each refuses:
engine.models.gguf_arch.

`qtype` picks the type of the matrices: "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0",
"Q5_1" (the types the `gguf` package, llama.cpp's own Python writer, quantizes), the K-quant mixes
"Q4_K_M", "Q5_K_M", "Q6_K" (each tensor's type as llama.cpp's quantizer picks it, `gguf_kquants.mix_type`:
attn_v and some ffn_down at Q6_K, the output Q6_K, the rest Q4_K / Q5_K; written by `gguf_kquants`),
or "source": each weight in the type it had in the source file (an unchanged quantized weight's
blocks copied bit for bit; a changed one quantized again in its type when Ember writes it, else
Q8_0). Vectors (norms, biases) and a mixture's router (`ffn_gate_inp`) are F32 in every quantized
type, as llama.cpp's quantizer keeps them; a matrix whose row
length is not a multiple of the type's block is F16 (llama.cpp's quantizer falls back likewise;
in a K mix a K-quant falls back first to Q5_0, Q5_1 or Q8_0 as llama.cpp's does).

The metadata: the architecture's sizes, rope and norm settings from the model's config, typed as
llama.cpp's loader checks them (the `GGUFWriter` methods), and the tokenizer (`tokenizer.ggml.*`,
the chat template `tokenizer.chat_template`) copied from the GGUF file the model was opened from,
or the `tokenizer.*` keys given (`tokenizer=`), or, for a model opened from a Hugging Face folder,
its tokenizer.json converted as llama.cpp's converter does (`gguf_vocab.folder_gguf_tokenizer`:
byte-level BPE, SentencePiece-style BPE; a tokenizer llama.cpp would tokenize otherwise is refused, naming what it found). A
model of another family is refused before anything is written. The file is written beside the
target and moved into place
(`engine.store.atomic.atomic_write`): a cancelled or failed export leaves the old file, if any.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable

import numpy as np

from ..module.reparam import iter_param_slots
from ..store.atomic import atomic_write, os_error_reason
from ..store.errors import RecordError
from ..store.gguf_file import open_gguf
from ..tensor.raw import array
from .gguf_arch import arch_metadata, arch_tensors, export_architecture
from .gguf_kquants import KQUANT_TYPES, MIXES, is_router, mix_type, quantize_k
from .gguf_model import gguf_weight_map
from .gguf_vocab import folder_gguf_tokenizer
from .gguf_weight import GGUFWeight
from .hf_folder import PretrainedError
from .mapping import RopePermute, Rule, Split
from .moe import ExpertPart
from .pretrained import PretrainedInfo, pretrained_info

__all__ = ["EXPORT_TYPES", "QUANTIZE_TYPES", "Planned", "gguf_architecture", "gguf_source", "save_gguf",
           "write_gguf_file"]

QUANTIZE_TYPES = ("BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # what gguf.quants.quantize writes
EXPORT_TYPES = ("F32", "F16") + QUANTIZE_TYPES + tuple(MIXES) + ("source",)
_WRITTEN_TYPES = ("F32", "F16") + QUANTIZE_TYPES + KQUANT_TYPES  # the ggml types Ember quantizes to
WRITTEN = "Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, Phi-3, Gemma, Gemma 2 and Gemma 3 models"
_FILE_TYPE = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q8_0": "MOSTLY_Q8_0",
              "Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1", "Q5_0": "MOSTLY_Q5_0", "Q5_1": "MOSTLY_Q5_1",
              **{mix: file_type for mix, (_, file_type) in MIXES.items()}}


def gguf_architecture(model) -> tuple[str, PretrainedInfo]:
    """llama.cpp's architecture name for `model` and its pretrained info; a PretrainedError for a
    model llama.cpp's names do not cover."""
    info = pretrained_info(model)
    if info is None:
        raise PretrainedError(f"this {type(model).__name__} was not opened from a pretrained model: GGUF export "
                              f"writes a model opened with Open Pretrained or Open GGUF")
    arch = export_architecture(info.config)
    if arch is None:
        model_type = getattr(info.config, "model_type", None)
        raise PretrainedError(f"a {info.family.name} model ({model_type}) has no GGUF export in Ember; it writes "
                              f"{WRITTEN}")
    return arch, info


def gguf_source(info: PretrainedInfo):
    """Where the exported file's tokenizer keys come from: the (header of the) GGUF file the model was
    opened from, or for a model opened from a folder its tokenizer converted (`gguf_vocab`); a
    PretrainedError when the file can no longer be read or the tokenizer has no faithful GGUF form."""
    if info.gguf is None:
        if info.folder is None:
            raise PretrainedError("the model remembers neither its GGUF file nor its folder: no tokenizer to write")
        return folder_gguf_tokenizer(info.folder, int(info.config.vocab_size))
    try:
        return open_gguf(info.gguf)
    except RecordError as exc:
        raise PretrainedError(f"the source GGUF cannot be read again: {exc.reason}", where=exc.where) from None


def _kv(writer, key: str, value) -> None:
    """Copy one metadata value (a tokenizer or general key) with the type llama.cpp expects."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, int):
        (writer.add_uint32 if value >= 0 else writer.add_int32)(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, (list, tuple)) and value:
        writer.add_array(key, list(value))


def _metadata(writer, arch: str, cfg, source, file_type: int | None, tokenizer: dict | None = None) -> None:
    import gguf  # noqa: PLC0415

    name = source.metadata.get("general.name") if source is not None else None
    if isinstance(name, str):
        writer.add_name(name)
    writer.add_context_length(int(cfg.max_position_embeddings))
    writer.add_embedding_length(int(cfg.hidden_size))
    writer.add_block_count(int(cfg.num_hidden_layers))
    writer.add_feed_forward_length(int(cfg.intermediate_size))
    writer.add_head_count(int(cfg.num_attention_heads))
    writer.add_head_count_kv(int(cfg.num_key_value_heads))
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    writer.add_rope_freq_base(float(cfg.rope_theta))
    writer.add_rope_dimension_count(int(cfg.head_dim))
    if cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size:
        writer.add_key_length(int(cfg.head_dim))
        writer.add_value_length(int(cfg.head_dim))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    elif kind is not None and not (arch == "phi3" and kind == "longrope"):  # Phi-3's: gguf_arch writes it
        raise PretrainedError(f"rope scaling {kind!r} has no GGUF form in Ember's export (it writes 'linear')")
    writer.add_vocab_size(int(cfg.vocab_size))
    arch_metadata(writer, arch, cfg)
    if file_type is not None:
        writer.add_file_type(int(file_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    keys = tokenizer if tokenizer is not None else {k: v for k, v in source.metadata.items()
                                                    if k.startswith("tokenizer.")}
    if "tokenizer.ggml.model" not in keys:
        where = str(source.path) if tokenizer is None else None
        raise PretrainedError(f"{'the source GGUF' if where else 'the tokenizer metadata given'} has no tokenizer "
                              f"(tokenizer.ggml.model): llama.cpp could not run the exported file", where=where)
    for key, value in keys.items():
        _kv(writer, key, value)


class Planned:
    """One tensor to write: its GGUF name, ggml type, NumPy shape, bytes, and how to get its data."""

    def __init__(self, name: str, qtype: str, shape: tuple, nbytes: int, data: Callable[[], np.ndarray]):
        self.name, self.qtype, self.shape, self.nbytes, self.data = name, qtype, shape, nbytes, data


def _nbytes(qtype: str, shape: tuple) -> int:
    import gguf  # noqa: PLC0415

    if qtype == "F32":
        return 4 * math.prod(shape)
    if qtype == "F16":
        return 2 * math.prod(shape)
    return math.prod(gguf.quants.quant_shape_to_byte_shape(shape, gguf.GGMLQuantizationType[qtype]))


def _block(qtype: str) -> int:
    import gguf  # noqa: PLC0415

    return 1 if qtype in ("F32", "F16") else gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][0]


_CHUNK_VALUES = 1 << 21  # values `gguf.quants.quantize` takes at a time between two `check()`s


def _encode(values: np.ndarray, qtype: str, check: Callable[[], None] | None = None) -> np.ndarray:
    """`values` in `qtype`; `check()` is called between chunks of rows (it raises to cancel)."""
    import gguf  # noqa: PLC0415

    values = np.ascontiguousarray(values, dtype=np.float32)
    if qtype == "F32":
        return values
    if qtype == "F16":
        return values.astype(np.float16)
    if qtype in KQUANT_TYPES:
        return quantize_k(values, qtype, check)
    kind = gguf.GGMLQuantizationType[qtype]
    rows = values.reshape(-1, values.shape[-1]) if values.ndim > 1 else values.reshape(1, -1)
    step = max(1, _CHUNK_VALUES // max(1, rows.shape[1]))
    parts = []
    for i in range(0, rows.shape[0], step):  # row by row the blocks are the whole tensor's
        if check is not None:
            check()
        parts.append(gguf.quants.quantize(rows[i:i + step], kind))
    blocks = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    return blocks.reshape(*values.shape[:-1], blocks.shape[-1])


class _Mix:
    """What a K mix's per-tensor choice needs to know of the model (llama.cpp's quantize state)."""

    def __init__(self, mix: str, cfg, has_output: bool):
        self.mix, self.has_output = mix, has_output
        self.n_layers = int(cfg.num_hidden_layers)
        self.n_experts = int(getattr(cfg, "num_local_experts", 0) or getattr(cfg, "num_experts", 0) or 0)

    def type_of(self, name: str, row: int) -> str:
        layer = int(name.split(".")[1]) if name.startswith("blk.") else None
        return mix_type(self.mix, name, row, n_layers=self.n_layers, n_experts=self.n_experts,
                        has_output=self.has_output, v_index=layer, n_v=self.n_layers)


def _choose(qtype: str, p, stored_shape: tuple, source_type: str | None, name: str = "",
            mix: _Mix | None = None) -> tuple[str, bool]:
    """(the type to write, whether the stored blocks are copied as they are)."""
    r = p.reparameterization
    if len(stored_shape) < 2:
        return "F32", False
    if qtype == "source":
        want = source_type or "F32"
        if isinstance(r, GGUFWeight):
            return want, True
        if want not in _WRITTEN_TYPES:
            want = "Q8_0"  # a changed weight of a type Ember does not write
    elif mix is not None:
        want = mix.type_of(name, stored_shape[-1])
        return want, isinstance(r, GGUFWeight) and r.qtype == want
    else:
        want = "F32" if is_router(name) and qtype in QUANTIZE_TYPES else qtype  # llama.cpp's quantizer's too
        if isinstance(r, GGUFWeight) and r.qtype == want:
            return want, True
    if stored_shape[-1] % _block(want):
        want = "F16"
    return want, False


def _joined(rule: Rule) -> bool:
    """Whether the rule's tensor is one of several parameters' (a fused or a stacked experts tensor)."""
    return rule.split is not None or bool(rule.transforms and isinstance(rule.transforms[0], ExpertPart))


def _plan(model, arch: str, info: PretrainedInfo, qtype: str, check: Callable[[], None] | None = None) -> list[Planned]:
    cfg = info.config
    wmap = gguf_weight_map(arch, cfg)
    mix = None
    if qtype in MIXES:
        names = {hit[1] for path, _ in iter_param_slots(model) if (hit := wmap.find(path)) is not None}
        mix = _Mix(qtype, cfg, "output.weight" in names)
    out: list = []
    groups: dict[str, list] = {}  # a fused / stacked tensor's name -> its parameters (rule, param, path)
    seen = set()
    inner: list[str] = []  # the parameters of a reparameterization (its factors, its blocks) are in its value
    for path, p in iter_param_slots(model):
        if p.id in seen or any(path.startswith(prefix) for prefix in inner):
            continue
        seen.add(p.id)
        if p.reparameterization is not None:
            inner.append(path + ".")
        hit = wmap.find(path)
        if hit is None:
            raise PretrainedError(f"parameter '{path}' has no GGUF tensor name (llama.cpp's {arch} has none for it)")
        rule, name = hit
        if _joined(rule):
            if name not in groups:
                groups[name] = []
                out.append(name)
            groups[name].append((rule, p, path))
            continue
        stored_shape = rule.stored_shape(tuple(p.lazy_shape()))
        want, copy = _choose(qtype, p, stored_shape, info.stored_dtypes.get(info.gguf_names.get(path, "")), name, mix)
        out.append(Planned(name, want, stored_shape, _nbytes(want, stored_shape), _data(p, rule, want, copy, check)))
    return [_group(name, groups[name], qtype, info, mix, check) if isinstance(name, str) else name for name in out]


def _part_key(rule: Rule) -> tuple:
    first = rule.transforms[0]
    return (first.index,) if isinstance(first, Split) else (first.expert, first.part)


def _group(name: str, members: list, qtype: str, info: PretrainedInfo, mix: _Mix | None = None,
           check: Callable[[], None] | None = None) -> Planned:
    """One tensor of several parameters: Phi-3's fused rows (a `Split`'s parts concatenated in order) or
    a layer's experts stacked `[experts, rows, cols]` (`ExpertPart`)."""
    members = sorted(members, key=lambda m: _part_key(m[0]))
    rests = [Rule(r.hf, r.ember, r.transforms[1:]) for r, _, _ in members]
    shapes = [rest.stored_shape(tuple(p.lazy_shape())) for rest, (_, p, _) in zip(rests, members)]
    first = members[0][0].transforms[0]
    if isinstance(first, Split):
        if len(members) != first.parts:
            raise PretrainedError(f"tensor {name!r}: {len(members)} of its {first.parts} parts found (an Ember bug)")
        shape = list(shapes[0])
        shape[first.axis] = sum(s[first.axis] for s in shapes)
        shape = tuple(shape)
    else:
        if len(members) != first.n_experts * first.parts:
            raise PretrainedError(f"tensor {name!r}: {len(members)} of its {first.n_experts * first.parts} experts' "
                                  f"parts found (an Ember bug)")
        shape = first.stored_shape(shapes[0])
    decisions = [_choose(qtype, p, shape, info.stored_dtypes.get(info.gguf_names.get(path, "")), name, mix)
                 for _, p, path in members]
    want = decisions[0][0]
    copy = all(d == (want, True) for d in decisions) and (isinstance(first, ExpertPart) or first.axis == 0)
    if not copy:
        if want not in _WRITTEN_TYPES:
            want = "Q8_0"  # a changed tensor of a type Ember does not write
        if shape[-1] % _block(want):
            want = "F16"
    axis = first.axis if isinstance(first, Split) else 0

    def data() -> np.ndarray:
        parts = [_data(p, rest, want, copy, encode=False)() for rest, (_, p, _) in zip(rests, members)]
        if copy:  # the blocks' rows, in order
            return np.ascontiguousarray(np.concatenate(parts, axis=0))
        joined = np.concatenate(parts, axis=axis).reshape(shape)
        return _encode(joined, want, check)
    return Planned(name, want, shape, _nbytes(want, shape), data)


def _data(p, rule: Rule, qtype: str, copy: bool, check=None, encode: bool = True):
    def blocks() -> np.ndarray:
        r = p.reparameterization
        data = np.asarray(array(r.blocks.data.val()))
        rows = [t for t in rule.transforms if isinstance(t, RopePermute)]
        return Rule(rule.hf, rule.ember, rows).save(data) if rows else np.ascontiguousarray(data)

    def values() -> np.ndarray:
        value = rule.save(np.asarray(array(p.val()), dtype=np.float32))
        return _encode(value, qtype, check) if encode else value
    return blocks if copy else values


def save_gguf(model, path, qtype: str = "F16", *, check: Callable[[], None] | None = None,
              progress: Callable[[int, int], None] | None = None, tokenizer: dict | None = None) -> Path:
    """Write `model` merged as a GGUF file at `path` (see this file's doc); returns the path.
    `check()` is called between tensors and, while one is quantized, between chunks of its rows (a
    fraction of a second apart; it raises to cancel: the target is left as it was);
    `progress(done, total)` after each tensor. `tokenizer`: the `tokenizer.*` metadata to write
    instead of the source GGUF's or of a folder model's converted tokenizer.json."""
    import gguf  # noqa: PLC0415

    if qtype not in EXPORT_TYPES:
        raise ValueError(f"save_gguf: qtype must be one of {', '.join(EXPORT_TYPES)}, got {qtype!r}")
    arch, info = gguf_architecture(model)
    if tokenizer is not None and not all(isinstance(k, str) and k.startswith("tokenizer.") for k in tokenizer):
        raise ValueError("save_gguf: tokenizer must map 'tokenizer.*' metadata keys to values")
    source = gguf_source(info) if tokenizer is None or info.gguf is not None else None
    try:
        plan = _plan(model, arch, info, qtype, check)
        for name, value in arch_tensors(arch, info.config).items():  # Phi-3's longrope factors
            plan.append(Planned(name, "F32", value.shape, value.nbytes, lambda v=value: v))
        if qtype == "source":
            file_type = source.metadata.get("general.file_type") if source is not None else None
            file_type = file_type if isinstance(file_type, int) and not isinstance(file_type, bool) else None
        else:
            file_type = gguf.LlamaFileType[_FILE_TYPE[qtype]].value
        target = Path(os.fspath(path))

        def metadata(writer) -> None:
            _metadata(writer, arch, info.config, source, file_type, tokenizer)
        return write_gguf_file(target, arch, metadata, plan, check, progress)
    finally:
        if source is not None:
            source.close()


def write_gguf_file(target: Path, arch: str, metadata: Callable, plan: list, check=None, progress=None) -> Path:
    """Write a GGUF file at `target` atomically with `gguf.GGUFWriter`: `metadata(writer)` adds the
    keys, `plan` lists the tensors (`Planned`: name, ggml type, NumPy shape, bytes, `data()`),
    whose data are computed one at a time as they are written (`check()` between them cancels)."""
    import gguf  # noqa: PLC0415

    def write(fp) -> None:
        writer = gguf.GGUFWriter(None, arch)
        metadata(writer)
        for t in plan:
            raw = None if t.qtype in ("F32", "F16") else gguf.GGMLQuantizationType[t.qtype]
            if raw is None:
                writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32 if t.qtype == "F32" else np.float16),
                                       t.nbytes)
            else:
                byte_shape = gguf.quants.quant_shape_to_byte_shape(t.shape, raw)
                writer.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=raw)
        writer.fout = [fp]
        writer.state = gguf.gguf_writer.WriterState.EMPTY
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, t in enumerate(plan):
            if check is not None:
                check()
            data = t.data()
            if data.nbytes != t.nbytes:
                raise PretrainedError(f"tensor {t.name!r}: {data.nbytes} bytes computed, {t.nbytes} planned "
                                      f"(an Ember bug)")
            writer.write_tensor_data(data)
            if progress is not None:
                progress(i + 1, len(plan))

    if target.is_dir():
        raise PretrainedError("expected a file name to write the GGUF to, found a folder", where=str(target))
    try:
        atomic_write(target, write, error=PretrainedError)
    except OSError as exc:
        raise PretrainedError(f"cannot write: {os_error_reason(exc)}", where=exc.filename or str(target)) from None
    return target
