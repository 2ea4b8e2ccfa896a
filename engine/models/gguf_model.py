"""`from_pretrained("model.gguf")`: a decoder model from a GGUF file, lazily, kept quantized.

1. `engine.store.gguf_file.open_gguf` reads the header (metadata and tensor table) and nothing else;
2. the architecture (`general.architecture`) picks the family (engine.models.gguf_arch): llama.cpp's
   "llama" (Llama and Mistral files; Mixtral with `llama.expert_count`), "qwen2", "qwen3", "phi3",
   "gemma", "gemma2", "gemma3", "qwen2moe" and "qwen3moe"; any other is refused, naming it;
3. the sizes, rope and norm settings come from the metadata under the architecture's prefix
   (`llama.block_count`, `llama.embedding_length`, `llama.attention.head_count(_kv)`,
   `llama.rope.freq_base`, `llama.attention.layer_norm_rms_epsilon`, `llama.context_length`, ...,
   and the architecture's own: experts, soft-caps, windows) as a config.json would give them, and the
   family's own config reader checks them;
4. llama.cpp's tensor names (`token_embd`, `blk.N.attn_q`, ..., `output_norm`, `output`) map onto
   Ember's parameters (`gguf_weight_map`: the family's Hugging Face map with llama.cpp's names).
   llama.cpp stores the q/k rows of a "llama" file permuted from Hugging Face's order into
   interleaved rotary pairs (its converter's `permute`), which is Ember's order: those rows are taken
   as they are. The other architectures keep Hugging Face's order (NEOX rotary), which Ember
   permutes as it does a Hugging Face folder's;
5. every shape is checked before anything is read; each parameter becomes lazy: a float tensor
   (F32, F16, BF16) is read and widened at first use, a quantized one becomes a `GGUFWeight`
   (its blocks read at first use, kept, and dequantized each time a computation needs the weight).
   One expert of a stacked experts tensor (`blk.N.ffn_gate_exps` `[experts, rows, cols]`) and one
   part of a fused one (Phi-3's `attn_qkv`, `ffn_up`) are their own rows of the file, read alone and,
   when quantized, kept in their blocks like any other weight.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..module import Module, Param
from ..module.tree import params as tree_params
from ..store.burnpack import bf16_to_float32
from ..store.errors import RecordError
from ..store.gguf_file import GGUFFile, GGUFTensor, open_gguf
from ..tensor import Tensor
from ..tensor.dtype import as_dtype
from .gguf_arch import ARCHITECTURES, arch_config, hf_architecture, per_expert_names
from .gguf_arch import gguf_weight_map as arch_weight_map
from .gguf_weight import GGUFBlocks, GGUFWeight
from .hf_folder import PretrainedError
from .mapping import RopePermute, Rule, Split, Transpose, WeightMap
from .moe import ExpertPart
from .pretrained import FAMILIES, PretrainedInfo, _Attach, _check_layers, _no_check, pretrained_info

__all__ = ["ARCHITECTURES", "from_gguf", "gguf_config", "gguf_storage", "gguf_weight_map"]

def _meta(file: GGUFFile, key: str, kind, default=None, required=True):
    value = file.metadata.get(key)
    if value is None:
        if required and default is None:
            raise PretrainedError(f"metadata {key!r} is missing (a {file.architecture} model needs it)",
                                  where=str(file.path))
        return default
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if not ok:
        raise PretrainedError(f"metadata {key!r}: expected {kind.__name__ if isinstance(kind, type) else 'a number'},"
                              f" found {value!r}", where=str(file.path))
    return value


def gguf_config(file: GGUFFile) -> dict:
    """The config.json a Hugging Face folder of this model would hold, from the GGUF metadata."""
    arch = file.architecture
    model_type, architecture = hf_architecture(file)
    where = str(file.path)
    kind = file.metadata.get("general.type")
    if kind not in (None, "model"):
        raise PretrainedError(f"the file is a GGUF {kind!r} (general.type), not a model; a LoRA adapter is applied "
                              f"over its base model", where=where)
    num = (int, float)
    heads = _meta(file, f"{arch}.attention.head_count", int)
    hidden = _meta(file, f"{arch}.embedding_length", int)
    tokens = file.metadata.get("tokenizer.ggml.tokens")
    embd = file.tensors.get("token_embd.weight")
    vocab = file.metadata.get(f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(tokens) if isinstance(tokens, list) else (embd.shape[0] if embd is not None else None)
    if vocab is None:
        raise PretrainedError(f"no vocabulary size: no {arch}.vocab_size, tokenizer.ggml.tokens or token_embd",
                              where=str(file.path))
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": _meta(file, f"{arch}.feed_forward_length", int),
        "num_hidden_layers": _meta(file, f"{arch}.block_count", int),
        "num_attention_heads": heads,
        "num_key_value_heads": _meta(file, f"{arch}.attention.head_count_kv", int, heads),
        "rms_norm_eps": float(_meta(file, f"{arch}.attention.layer_norm_rms_epsilon", num)),
        "rope_theta": float(_meta(file, f"{arch}.rope.freq_base", num, 10000.0)),
        "max_position_embeddings": _meta(file, f"{arch}.context_length", int),
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "hidden_act": "silu",
    }
    key_length = file.metadata.get(f"{arch}.attention.key_length")
    if key_length is not None:
        config["head_dim"] = _meta(file, f"{arch}.attention.key_length", int)
    head_dim = config.get("head_dim") or (hidden // heads if heads > 0 else 0)
    rotary = file.metadata.get(f"{arch}.rope.dimension_count")
    if rotary is not None and rotary != head_dim:
        raise PretrainedError(f"metadata '{arch}.rope.dimension_count' is {rotary!r}: the rotary encoding covers part "
                              f"of each head of {head_dim}, which Ember's {arch} family does not build (it rotates "
                              f"the whole head)", where=where)
    scaling = file.metadata.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise PretrainedError(f"metadata '{arch}.rope.scaling.type' is {scaling!r}; Ember reads 'none' and "
                                  f"'linear'", where=str(file.path))
        config["rope_scaling"] = {"rope_type": "linear",
                                  "factor": float(_meta(file, f"{arch}.rope.scaling.factor", num))}
    if "rope_freqs.weight" in file.tensors:
        raise PretrainedError("the file holds 'rope_freqs.weight' (per-frequency rope factors, Llama 3.1's scaling "
                              "in llama.cpp's form), which Ember does not read", where=str(file.path))
    biased = "blk.0.attn_q.bias" in file.tensors
    config["attention_bias"] = biased
    config["attention_output_bias"] = "blk.0.attn_output.bias" in file.tensors
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        value = file.metadata.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(value, int) and not isinstance(value, bool):
            config[key] = value
    arch_config(file, config)
    return config


def gguf_weight_map(arch: str, cfg, names=()) -> WeightMap:
    """llama.cpp's tensor names <-> Ember's paths for a model of `cfg` (see engine.models.gguf_arch);
    `names`: the file's tensor names, when reading (older Mixtral files store each expert alone)."""
    fam = next((f for f in FAMILIES if cfg.architecture in f.architectures), None)
    if fam is None:
        raise PretrainedError(f"no family builds a {cfg.architecture} (an Ember bug)")
    return arch_weight_map(arch, cfg, fam.weight_map(cfg), per_expert=per_expert_names(names))


def _read(file: GGUFFile, name: str) -> np.ndarray:
    """The stored tensor; a file that changed or cannot be read is a PretrainedError naming it."""
    try:
        return file.read(name)
    except RecordError as exc:
        raise PretrainedError(f"tensor {name!r} could not be read: {exc.reason}", where=str(file.path)) from None
    except OSError as exc:
        raise PretrainedError(f"tensor {name!r} could not be read: {exc.strerror or exc}",
                              where=str(file.path)) from None


def _row_part(rule: Rule, shape: tuple) -> tuple[int, int] | None:
    """(first row, row count) of the stored tensor (viewed as `[rows, last dim]`) that the rule's first
    transform takes: one expert of a stacked experts tensor (`ExpertPart`), or a slice of the rows of a
    fused tensor (a `Split` along axis 0: Phi-3's attn_qkv, ffn_up); None when it takes the whole."""
    first = rule.transforms[0] if rule.transforms else None
    if isinstance(first, ExpertPart):
        rows = first.shape(shape)[0]
        return first.expert * shape[1] + first.part * rows, rows
    if isinstance(first, Split) and first.axis == 0 and len(shape) == 2:
        sizes = first.sizes or (shape[0] // first.parts,) * first.parts
        return sum(int(n) for n in sizes[:first.index]), first.shape(shape)[0]
    return None


def _stored(file: GGUFFile, t: GGUFTensor, rule: Rule) -> tuple[np.ndarray, Rule]:
    """(the stored array the rule reads, the rule's transforms left to apply): the rows of one expert
    or one part of a fused tensor are read alone (`_row_part`), anything else whole."""
    span = _row_part(rule, t.shape)
    if span is None:
        return _read(file, t.name), rule
    try:
        data = file.read_rows(t.name, *span)
    except RecordError as exc:
        raise PretrainedError(f"tensor {t.name!r} could not be read: {exc.reason}", where=str(file.path)) from None
    except OSError as exc:
        raise PretrainedError(f"tensor {t.name!r} could not be read: {exc.strerror or exc}",
                              where=str(file.path)) from None
    return data, Rule(rule.hf, rule.ember, rule.transforms[1:])


def _float_init(file: GGUFFile, t: GGUFTensor, rule: Rule, dtype):
    target = as_dtype(dtype).np

    def init(device, require_grad):
        stored, rest = _stored(file, t, rule)
        if t.type == "BF16":
            stored = bf16_to_float32(stored).reshape(stored.shape)
        value = Tensor.from_data(rest.load(stored, dtype=target), device=device, dtype=dtype)
        return value.require_grad() if require_grad else value
    return init


def _rows_rule(rule: Rule) -> Rule:
    """The rule's expert slice and row permutations (applied to the stored blocks once, at reading)."""
    keep = [t for t in rule.transforms if isinstance(t, (RopePermute, ExpertPart, Split))]
    return Rule(rule.hf, rule.ember, keep)


def _blocks_init(file: GGUFFile, t: GGUFTensor, rows: Rule):
    def init(device, require_grad):
        data, rest = _stored(file, t, rows)
        if rest.transforms:
            data = rest.load(data)
        return Tensor.from_data(data, device=device, dtype="uint8")
    return init


def _placeholder(dtype: str, shape):
    def init(device, require_grad):
        zeros = device.xp.broadcast_to(device.xp.zeros((), dtype=np.dtype(dtype)), shape)
        return Tensor.from_data(zeros, device=device, dtype=dtype)
    return init


def _quantized_param(file: GGUFFile, t: GGUFTensor, rule: Rule, param: Param, dtype: str) -> Param:
    span = _row_part(rule, t.shape)  # one expert's rows, or a fused tensor's part
    stored = (span[1], t.shape[-1]) if span is not None else tuple(t.shape)
    others = [x for x in rule.transforms[1 if span is not None else 0:] if not isinstance(x, (RopePermute, Transpose))]
    if others or t.type in ("F32", "F16", "BF16") or len(stored) != 2:
        raise PretrainedError(f"tensor {t.name!r}: a {t.type} tensor of dims {list(t.shape)} cannot be kept "
                              f"quantized for '{rule.ember}'", where=str(file.path))
    rows, bytes_per_row = stored[0], t.nbytes // (t.numel // t.shape[-1])
    device = param.lazy_device()
    data = Param.uninitialized(_blocks_init(file, t, _rows_rule(rule)), device, False, (rows, bytes_per_row),
                               kind="int", itemsize=1)
    transpose = any(isinstance(x, Transpose) for x in rule.transforms)
    weight = GGUFWeight(GGUFBlocks(data, t.type), stored, transpose, dtype)
    shape = tuple(param.lazy_shape())
    base = Param.uninitialized(_placeholder(dtype, shape), device, False, shape, id=param.id)
    return base.with_reparameterization(weight)


def from_gguf(path, device=None, dtype="float32", check: Callable[[], None] | None = None) -> Module:
    """Open a GGUF file as an Ember model (see this file's doc). Quantized weights stay quantized
    (frozen: their values are the file's); float weights are lazy trainable parameters."""
    try:
        file = open_gguf(path)
    except RecordError as exc:
        raise PretrainedError(exc.reason, where=exc.where) from None
    try:
        return _build(file, device, as_dtype(dtype).name, check or _no_check)
    except BaseException:
        file.close()
        raise


def _build(file: GGUFFile, device, dtype: str, check) -> Module:
    where = str(file.path)
    config = gguf_config(file)
    fam = next(f for f in FAMILIES if config["architectures"][0] in f.architectures)
    try:
        cfg = fam.config_from_json(config)
    except PretrainedError as exc:
        raise PretrainedError(f"{exc.reason} (from the GGUF metadata)", where=where) from None
    wmap = gguf_weight_map(file.architecture, cfg, file.tensors)
    tensors = file.tensors
    _check_layers(fam, cfg, wmap, tensors, where)
    model = fam.build(cfg, device)
    plan: dict[str, Param] = {}
    names: dict[str, str] = {}
    used: set[str] = set()
    by_id: dict = {}
    missing: list[str] = []
    for path, param in tree_params(model):
        check()
        if param.id in by_id:
            plan[path] = by_id[param.id]
            continue
        hit = wmap.find(path)
        if hit is None:
            raise PretrainedError(f"no GGUF tensor name for parameter '{path}' (an Ember bug)", where=where)
        rule, name = hit
        t = tensors.get(name)
        if t is None:
            missing.append(f"'{name}' (for '{path}')")
            continue
        try:
            shape = rule.ember_shape(t.shape)
        except ValueError as exc:
            raise PretrainedError(f"tensor {name!r} does not fit '{path}': {exc}", where=where) from None
        expected = tuple(param.lazy_shape())
        if shape != expected:
            raise PretrainedError(f"tensor {name!r} has dims {list(t.shape)} ({list(shape)} as Ember lays it out); "
                                  f"the metadata gives '{path}' dims {list(expected)}", where=where)
        if t.quantized:
            new = _quantized_param(file, t, rule, param, dtype)
        else:
            new = Param.uninitialized(_float_init(file, t, rule, dtype), param.lazy_device(),
                                      param.lazy_is_require_grad(), expected, id=param.id)
        plan[path] = by_id[param.id] = new
        names[path] = name
        used.add(name)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise PretrainedError(f"the file lacks tensors the metadata needs: {'; '.join(missing[:5])}{more}",
                              where=where)
    extra = [n for n in tensors if n not in used and not wmap.ignored(n)]
    if extra:
        shown = ", ".join(repr(n) for n in extra[:5]) + (f" (and {len(extra) - 5} more)" if len(extra) > 5 else "")
        raise PretrainedError(f"{len(extra)} tensor(s) fit no parameter of a {fam.name} model with this metadata: "
                              f"{shown}", where=where)
    out = model.map(_Attach(plan, check))
    hf_map = fam.weight_map(cfg)  # the Hugging Face names (PEFT adapters, saving, displays use them)
    hf_names = {path: hit[1] for path in names if (hit := hf_map.find(path)) is not None}
    out._pretrained = PretrainedInfo(
        family=fam, config=cfg, raw_config=config, folder=None, names=hf_names,
        stored_dtypes={n: tensors[n].type for n in used}, gguf=file.path, gguf_names=names,
        stored_bytes={n: tensors[n].nbytes for n in used})
    return out


def gguf_storage(model) -> dict[str, tuple[str, str, int]]:
    """{Ember parameter path: (GGUF tensor name, ggml type such as "Q4_1", its bytes in the file)} of a
    model opened from a GGUF file (what a display shows of each weight's quantization); {} for any
    other model. A parameter that is part of a tensor (one expert of a stacked experts tensor, one of
    Phi-3's fused projections) counts its own rows' bytes, so that the bytes add up to the file's."""
    info = pretrained_info(model)
    if info is None or info.gguf is None:
        return {}
    sizes = {path: math.prod(p.lazy_shape()) for path, p in tree_params(model)}
    shared: dict[str, int] = {}  # tensor name -> the values of the parameters read from it
    for path, name in info.gguf_names.items():
        shared[name] = shared.get(name, 0) + sizes.get(path, 0)
    out = {}
    for path, name in info.gguf_names.items():
        total = info.stored_bytes[name]
        part = total if shared[name] == sizes.get(path) else total * sizes.get(path, 0) // max(shared[name], 1)
        out[path] = (name, info.stored_dtypes[name], part)
    return out
