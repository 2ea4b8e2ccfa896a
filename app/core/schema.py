"""The project file's schema: model sources, parameter-group specs, replayable edits and run
records as typed values, each with `to_json()` / `from_json()`.

`from_json` validates what it reads: a bad project file raises `SchemaError` naming the field
(`edits[2].rank`), what was expected and what was found. `to_json` writes the same JSON the
project files have always held, so files written before these types existed stay readable:

    {"kind": "example", "name": "burn-book"}                           ExampleSource
    {"kind": "script", "path": "/home/me/net.py", "factory": "build"}  ScriptSource
    {"kind": "checkpoint", "path": "w.bpk", "architecture": {...}, "allow_partial": false}
    {"kind": "design", "schema_version": 2, "design": {...}}           DesignSource
    {"kind": "pretrained", "path": "models/llama"}                     PretrainedSource
    {"kind": "onnx", "path": "cnn.onnx", "sha256": "<64 hex digits>"}  OnnxSource
    {"op": "freeze", "group": {"kind": "regex", "pattern": "^encoder\\\\."}}  GroupEdit
    {"op": "lora", "rank": 8, "alpha": 16.0, "init_std": null, "group": {"kind": "all"},
     "qlora": {"block_size": 64, "double_quant": true}}                LoraEdit
    {"op": "materialize"}, {"op": "fork", "device": "cpu:1"}, {"op": "to_device", ...},
    {"op": "load", "path": "/abs/w.bpk", "allow_partial": false}
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union


class SchemaError(ValueError):
    """A project value that does not fit the schema: names the field, what was expected and found."""

    def __init__(self, where: str, expected: str, found: Any):
        self.where = where
        self.expected = expected
        self.found = found
        super().__init__(f"{where}: expected {expected}, found {_found(found)}")


MISSING = object()  # what `found` is when the field is not there


class Described(str):
    """A `found` already in words (`a name of 5,000 bytes`), shown as it is rather than repr'd."""


def _found(value: Any) -> str:
    if value is MISSING:
        return "nothing (the field is missing)"
    if isinstance(value, Described):
        return str(value)
    if isinstance(value, str) and len(value) > 60:
        return f"{value[:40]!r}... ({len(value):,} characters)"
    if isinstance(value, (list, dict)) and len(value) > 8:  # never repr a whole (perhaps huge) container
        return f"{'a list' if isinstance(value, list) else 'an object'} of {len(value):,} item(s)"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 18:
        return f"an integer of {len(str(abs(value))):,} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Every text a project holds is bounded: names, devices and factories are short; a regex or a
# contract is a line or a paragraph; a path fits the file system (4,096 bytes, 255 a name).
MAX_NAME_CHARS = 256
MAX_TEXT_CHARS = 16_384
MAX_PATH_BYTES = 4096
MAX_PATH_PART_BYTES = 255
# Integers a project holds: LoRA ranks and QLoRA blocks (a rank past 65,536 is no adapter but
# a copy of the weight), and steps or epochs of a run.
MAX_RANK = 1 << 16
MAX_BLOCK = 1 << 20
MAX_COUNT = 1 << 53


def _text(value: str, where: str, expected: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`value` as a text a project may hold: valid unicode (no lone surrogates), at most `limit`
    characters."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SchemaError(where, f"{expected} of valid unicode text", value) from None
    if len(value) > limit:
        raise SchemaError(where, f"{expected} of at most {limit:,} characters",
                          Described(f"{len(value):,} characters"))
    return value


def check_path_text(value: str, where: str, expected: str = "a file path") -> str:
    """`value` as a path this machine could open: no NUL, valid unicode, at most 4,096 bytes
    and 255 bytes a name. Nothing is looked up on disk."""
    _text(value, where, expected, MAX_PATH_BYTES)
    if "\x00" in value:
        raise SchemaError(where, f"{expected} without NUL characters", value)
    encoded = value.encode("utf-8")
    if len(encoded) > MAX_PATH_BYTES:
        raise SchemaError(where, f"{expected} of at most {MAX_PATH_BYTES:,} bytes",
                          Described(f"{len(encoded):,} bytes"))
    longest = max(len(part) for part in encoded.replace(b"\\", b"/").split(b"/"))
    if longest > MAX_PATH_PART_BYTES:
        raise SchemaError(where, f"{expected} whose file and folder names have at most {MAX_PATH_PART_BYTES} bytes",
                          Described(f"a name of {longest:,} bytes"))
    return value


def _object(data: Any, where: str) -> dict:
    if not isinstance(data, dict):
        raise SchemaError(where, "an object", data)
    return data


def _get(data: dict, key: str, types: type | tuple[type, ...], where: str, expected: str, default: Any = ...) -> Any:
    if key not in data:
        if default is ...:
            raise SchemaError(f"{where}.{key}", expected, MISSING)
        return default
    value = data[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise SchemaError(f"{where}.{key}", expected, value)
    if not isinstance(value, types):
        raise SchemaError(f"{where}.{key}", expected, value)
    if isinstance(value, str):
        _text(value, f"{where}.{key}", expected)
    return value


def _name(data: dict, key: str, where: str, expected: str, default: Any = ...) -> str:
    return _text(_get(data, key, str, where, expected, default), f"{where}.{key}", expected, MAX_NAME_CHARS)


def _path(data: dict, key: str, where: str, expected: str, default: Any = ...) -> str:
    return check_path_text(_get(data, key, str, where, expected, default), f"{where}.{key}", expected)


def _int(data: dict, key: str, where: str, low: int, high: int, default: Any = ...) -> int:
    value = _get(data, key, int, where, "an int", default)
    if not low <= value <= high:
        raise SchemaError(f"{where}.{key}", f"an int from {low:,} to {high:,}", value)
    return value


def _number(data: dict, key: str, where: str, expected: str, default: Any = ..., *, none: bool = False,
            low: float = -1e12, high: float = 1e12) -> float | None:
    """A finite number in [low, high] (None allowed when `none`), as a float."""
    types = (int, float, type(None)) if none else (int, float)
    value = _get(data, key, types, where, expected, default)
    if value is None:
        return None
    if isinstance(value, int) and abs(value) > 10 ** 18:
        raise SchemaError(f"{where}.{key}", expected, value)
    value = float(value)
    if not math.isfinite(value) or not low <= value <= high:
        raise SchemaError(f"{where}.{key}", expected, value)
    return value


# ---- parameter groups -------------------------------------------------------------------------
GROUP_KINDS = ("all", "regex", "path", "paths", "predicate")


@dataclass(frozen=True)
class GroupSpec:
    """Which parameters an edit applies to: all of them, a regex over paths, one exact path, a
    list of paths, or the paths containing a text. `to_param_group()` gives the engine's
    `ParamGroup`."""

    kind: str = "all"
    pattern: str = ""  # regex
    path: str = ""  # path
    paths: tuple[str, ...] = ()  # paths
    text: str = ""  # predicate

    @classmethod
    def subtree(cls, path: str) -> "GroupSpec":
        """Every parameter at or below `path` ("" is the whole model)."""
        if not path:
            return cls("all")
        return cls("regex", pattern="^" + re.escape(path) + r"(\.|$)")

    def to_json(self) -> dict:
        if self.kind == "regex":
            return {"kind": "regex", "pattern": self.pattern}
        if self.kind == "path":
            return {"kind": "path", "path": self.path}
        if self.kind == "paths":
            return {"kind": "paths", "paths": list(self.paths)}
        if self.kind == "predicate":
            return {"kind": "predicate", "text": self.text}
        return {"kind": self.kind}

    @classmethod
    def from_json(cls, data: Any, where: str = "group") -> "GroupSpec":
        data = _object(data, where)
        kind = data.get("kind", MISSING)
        if kind == "all":
            return cls("all")
        if kind == "regex":
            return cls("regex", pattern=_get(data, "pattern", str, where, "a regex (string)"))
        if kind == "path":
            return cls("path", path=_get(data, "path", str, where, "a parameter path (string)"))
        if kind == "paths":
            paths = _get(data, "paths", list, where, "a list of parameter paths")
            for i, p in enumerate(paths):
                if not isinstance(p, str):
                    raise SchemaError(f"{where}.paths[{i}]", "a parameter path (string)", p)
                _text(p, f"{where}.paths[{i}]", "a parameter path", MAX_TEXT_CHARS)
            return cls("paths", paths=tuple(paths))
        if kind == "predicate":
            return cls("predicate", text=_get(data, "text", str, where, "a text (string)"))
        raise SchemaError(f"{where}.kind", "one of " + ", ".join(GROUP_KINDS), _kind_found(kind))

    def to_param_group(self):
        """The engine's ParamGroup (`ParamGroup.from_spec`); a bad regex raises `ParamGroupError`
        with the regex module's message."""
        from engine.module import ParamGroup  # noqa: PLC0415

        return ParamGroup.from_spec(self.to_json())

    def describe(self) -> str:
        """`encoder.layers.0` for a subtree, `/pattern/` for another regex, `all parameters`, …"""
        if self.kind == "all":
            return "all parameters"
        if self.kind == "regex":
            m = re.fullmatch(r"\^(.*)\(\\\.\|\$\)", self.pattern)
            return re.sub(r"\\(.)", r"\1", m.group(1)) if m else f"/{self.pattern}/"
        if self.kind == "path":
            return self.path
        if self.kind == "paths":
            return ", ".join(self.paths)
        if self.kind == "predicate":
            return f"paths containing {self.text!r}"
        return str(self.to_json())


# ---- edits ------------------------------------------------------------------------------------
GROUP_OPS = ("freeze", "unfreeze", "no_grad")
EDIT_OPS = GROUP_OPS + ("lora", "materialize", "detach", "fork", "to_device", "load", "peft")


@dataclass(frozen=True)
class GroupEdit:
    """Freeze, unfreeze or stop gradients for a group of parameters."""

    op: str
    group: GroupSpec = field(default_factory=GroupSpec)

    def to_json(self) -> dict:
        return {"op": self.op, "group": self.group.to_json()}


@dataclass(frozen=True)
class QLoraSettings:
    block_size: int = 64
    double_quant: bool = True

    def to_json(self) -> dict:
        return {"block_size": self.block_size, "double_quant": self.double_quant}


@dataclass(frozen=True)
class LoraEdit:
    """Attach LoRA adapters (QLoRA when `qlora` is set) to a group's rank-2 weights."""

    op: ClassVar[str] = "lora"
    rank: int
    alpha: float
    init_std: float | None = None
    group: GroupSpec = field(default_factory=GroupSpec)
    qlora: QLoraSettings | None = None
    variant: str = "lora"  # LORA_VARIANTS: plain LoRA, rsLoRA (alpha / sqrt(rank)) or DoRA (magnitudes)
    # parameters trained whole beside the adapters (peft's modules_to_save and bias), unfrozen after attaching
    train_fully: GroupSpec | None = None

    def to_json(self) -> dict:
        out = {"op": "lora", "rank": self.rank, "alpha": self.alpha, "init_std": self.init_std,
               "group": self.group.to_json(), "qlora": None if self.qlora is None else self.qlora.to_json()}
        if self.variant != "lora":  # a plain LoRA edit reads as it always did
            out["variant"] = self.variant
        if self.train_fully is not None:
            out["train_fully"] = self.train_fully.to_json()
        return out


@dataclass(frozen=True)
class MaterializeEdit:
    """Fold the adapters into plain weights."""

    op: ClassVar[str] = "materialize"

    def to_json(self) -> dict:
        return {"op": "materialize"}


@dataclass(frozen=True)
class DetachEdit:
    """Remove the adapters (reparameterizations) of the parameters in `group`; keep the bases and
    every other change."""

    group: GroupSpec
    op: ClassVar[str] = "detach"

    def to_json(self) -> dict:
        return {"op": "detach", "group": self.group.to_json()}


@dataclass(frozen=True)
class MoveEdit:
    """Fork (`fork=True`) or transfer the model to a device."""

    device: str
    fork: bool = False

    @property
    def op(self) -> str:
        return "fork" if self.fork else "to_device"

    def to_json(self) -> dict:
        return {"op": self.op, "device": self.device}


@dataclass(frozen=True)
class LoadEdit:
    """Load weights from a checkpoint file into the model."""

    op: ClassVar[str] = "load"
    path: str
    allow_partial: bool = False

    def to_json(self) -> dict:
        return {"op": "load", "path": self.path, "allow_partial": self.allow_partial}


@dataclass(frozen=True)
class PeftEdit:
    """Attach the LoRA adapters of a PEFT adapter folder (adapter_config.json +
    adapter_model.safetensors) to the model (`engine.models.peft.load_peft_adapter`)."""

    op: ClassVar[str] = "peft"
    path: str

    def to_json(self) -> dict:
        return {"op": "peft", "path": self.path}


Edit = Union[GroupEdit, LoraEdit, MaterializeEdit, DetachEdit, MoveEdit, LoadEdit, PeftEdit]


LORA_VARIANTS = ("lora", "rslora", "dora")


def _lora_variant(data: dict, where: str, qlora: bool) -> str:
    variant = _get(data, "variant", str, where, "one of " + ", ".join(LORA_VARIANTS), "lora")
    if variant not in LORA_VARIANTS:
        raise SchemaError(f"{where}.variant", "one of " + ", ".join(LORA_VARIANTS), _kind_found(variant))
    if qlora and variant == "dora":
        raise SchemaError(f"{where}.variant", "lora or rslora with qlora (QLoRA has no DoRA)", variant)
    return variant


def edit_from_json(data: Any, where: str = "edit") -> Edit:
    data = _object(data, where)
    op = data.get("op", MISSING)
    if op in GROUP_OPS:
        return GroupEdit(op, GroupSpec.from_json(_get(data, "group", dict, where, "a group object"), f"{where}.group"))
    if op == "lora":
        q = data.get("qlora")
        if q is not None and q is not False:
            q = _object(q, f"{where}.qlora")
            q = QLoraSettings(_int(q, "block_size", f"{where}.qlora", 1, MAX_BLOCK, 64),
                              _get(q, "double_quant", bool, f"{where}.qlora", "true or false", True))
        init_std = _number(data, "init_std", where, "a standard deviation (a number from 0 to 1,000) or null", None,
                           none=True, low=0.0, high=1000.0)
        return LoraEdit(_int(data, "rank", where, 1, MAX_RANK),
                        _number(data, "alpha", where, "a finite number (LoRA alpha)"),
                        init_std,
                        GroupSpec.from_json(_get(data, "group", dict, where, "a group object"), f"{where}.group"),
                        q or None, _lora_variant(data, where, bool(q)),
                        None if data.get("train_fully") is None else GroupSpec.from_json(
                            _get(data, "train_fully", dict, where, "a group object or null"), f"{where}.train_fully"))
    if op == "materialize":
        return MaterializeEdit()
    if op == "detach":
        return DetachEdit(GroupSpec.from_json(_get(data, "group", dict, where, "a group object"), f"{where}.group"))
    if op in ("fork", "to_device"):
        return MoveEdit(_name(data, "device", where, "a device name (string)"), fork=op == "fork")
    if op == "load":
        return LoadEdit(_path(data, "path", where, "a checkpoint path (string)"),
                        _get(data, "allow_partial", bool, where, "true or false", False))
    if op == "peft":
        return PeftEdit(_path(data, "path", where, "a PEFT adapter folder (string)"))
    raise SchemaError(f"{where}.op", "one of " + ", ".join(EDIT_OPS), _kind_found(op))


def _kind_found(value: Any) -> Any:
    """What an `op` or `kind` field held, for a message (a value that is no text is named by its type)."""
    if value is MISSING or isinstance(value, str):
        return value
    return Described(f"{_found(value)} (not a text)")


# ---- sources ----------------------------------------------------------------------------------
SOURCE_KINDS = ("example", "script", "checkpoint", "design", "pretrained", "onnx")


@dataclass(frozen=True)
class ExampleSource:
    kind: ClassVar[str] = "example"
    name: str

    def to_json(self) -> dict:
        return {"kind": "example", "name": self.name}


@dataclass(frozen=True)
class ScriptSource:
    """A Python file and the factory function in it that returns the model."""

    kind: ClassVar[str] = "script"
    path: str
    factory: str = "build"

    def to_json(self) -> dict:
        return {"kind": "script", "path": self.path, "factory": self.factory}


@dataclass(frozen=True)
class CheckpointSource:
    """Weights loaded into the model an example or script source builds."""

    kind: ClassVar[str] = "checkpoint"
    path: str
    architecture: "ExampleSource | ScriptSource"
    allow_partial: bool = False

    def to_json(self) -> dict:
        return {"kind": "checkpoint", "path": self.path, "architecture": self.architecture.to_json(),
                "allow_partial": self.allow_partial}


@dataclass(frozen=True, eq=False)
class DesignSource:
    """A model built from a design; `data` is `engine.design.design_source`'s object, kept as is
    (the design's own schema, versioned and migrated by `engine.design`)."""

    kind: ClassVar[str] = "design"
    data: dict

    def to_json(self) -> dict:
        return dict(self.data)

    def __eq__(self, other) -> bool:
        return isinstance(other, DesignSource) and other.data == self.data


@dataclass(frozen=True)
class PretrainedSource:
    """A Hugging Face checkpoint folder (config.json plus weights) opened with
    `engine.models.from_pretrained`; `path` is the folder (relative to the project file in it)."""

    kind: ClassVar[str] = "pretrained"
    path: str

    def to_json(self) -> dict:
        return {"kind": "pretrained", "path": self.path}


@dataclass(frozen=True)
class OnnxSource:
    """An ONNX file imported with `engine.design.import_onnx`: its design built and its weights
    loaded (File ▸ Open ONNX…). `path` is the file (relative to the project file in it);
    `sha256` the digest of its bytes when it was imported, so a file changed since is refused
    rather than opened with other weights."""

    kind: ClassVar[str] = "onnx"
    path: str
    sha256: str

    def to_json(self) -> dict:
        return {"kind": "onnx", "path": self.path, "sha256": self.sha256}


Source = Union[ExampleSource, ScriptSource, CheckpointSource, DesignSource, PretrainedSource, OnnxSource]


def source_from_json(data: Any, where: str = "source") -> Source:
    data = _object(data, where)
    kind = data.get("kind", MISSING)
    if kind == "example":
        return ExampleSource(_name(data, "name", where, "an example name (string)"))
    if kind == "script":
        return ScriptSource(_path(data, "path", where, "a Python file path (string)"),
                            _name(data, "factory", where, "a function name (string)", "build"))
    if kind == "checkpoint":
        arch = source_from_json(_get(data, "architecture", dict, where, "a source object"), f"{where}.architecture")
        if not isinstance(arch, (ExampleSource, ScriptSource)):
            raise SchemaError(f"{where}.architecture.kind", "example or script", arch.kind)
        return CheckpointSource(_path(data, "path", where, "a checkpoint path (string)"), arch,
                                _get(data, "allow_partial", bool, where, "true or false", False))
    if kind == "design":
        from engine.design.design_schema import DesignSchemaError, check_source  # noqa: PLC0415

        try:
            check_source(data, where)
        except DesignSchemaError as e:
            raise SchemaError(e.where, e.expected, Described(e.found)) from None
        return DesignSource(dict(data))
    if kind == "pretrained":
        path = _path(data, "path", where, "a Hugging Face model folder (string)")
        if not path.strip():
            raise SchemaError(f"{where}.path", "a Hugging Face model folder (string)", path)
        return PretrainedSource(path)
    if kind == "onnx":
        path = _path(data, "path", where, "an ONNX file path (string)")
        if not path.strip():
            raise SchemaError(f"{where}.path", "an ONNX file path (string)", path)
        digest = _name(data, "sha256", where, "the SHA-256 of the file (64 hex digits)")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise SchemaError(f"{where}.sha256", "the SHA-256 of the file (64 lowercase hex digits)", digest)
        return OnnxSource(path, digest)
    raise SchemaError(f"{where}.kind", "one of " + ", ".join(SOURCE_KINDS), _kind_found(kind))


def describe_source(source: Source) -> str:
    """The window title's name for a source: `example mnist`, `net.py:build`, `w.bpk into …`."""
    from pathlib import Path  # noqa: PLC0415

    if isinstance(source, ExampleSource):
        return f"example {source.name}"
    if isinstance(source, ScriptSource):
        return f"{Path(source.path).name}:{source.factory}"
    if isinstance(source, CheckpointSource):
        return f"{Path(source.path).name} into {describe_source(source.architecture)}"
    if isinstance(source, PretrainedSource):
        return f"{Path(source.path).name} (Hugging Face)"
    if isinstance(source, OnnxSource):
        return f"{Path(source.path).name} (ONNX)"
    return source.kind


# ---- runs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunRecord:
    """One training run the project remembers: its name, folder and how it ended."""

    name: str
    folder: str
    status: str
    global_step: int = 0
    epoch: int = 0

    def to_json(self) -> dict:
        return {"name": self.name, "folder": self.folder, "status": self.status, "global_step": self.global_step,
                "epoch": self.epoch}

    @classmethod
    def from_json(cls, data: Any, where: str = "run") -> "RunRecord":
        data = _object(data, where)
        return cls(_name(data, "name", where, "a run name (string)"),
                   _path(data, "folder", where, "a folder path (string)"),
                   _name(data, "status", where, "a status (string)"),
                   _int(data, "global_step", where, 0, MAX_COUNT, 0),
                   _int(data, "epoch", where, 0, MAX_COUNT, 0))


# ---- the project ------------------------------------------------------------------------------
PROJECT_FORMAT = 1


@dataclass
class Project:
    """A whole project file: the model's source, the edits since, the edited contracts, the runs."""

    source: Source
    edits: list[Edit] = field(default_factory=list)
    contracts: dict[str, str] = field(default_factory=dict)
    runs: list[RunRecord] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"format": PROJECT_FORMAT, "application": "ember", "source": self.source.to_json(),
                "edits": [e.to_json() for e in self.edits], "contracts": dict(sorted(self.contracts.items())),
                "runs": [r.to_json() for r in self.runs]}

    @classmethod
    def from_json(cls, data: Any) -> "Project":
        data = _object(data, "the project")
        fmt = data.get("format", MISSING)
        if type(fmt) is not int or fmt != PROJECT_FORMAT:
            raise SchemaError("format", f"project format {PROJECT_FORMAT}", fmt)
        source = source_from_json(_get(data, "source", dict, "project", "a source object"), "source")
        edits = _get(data, "edits", list, "project", "a list of edits", [])
        contracts = _get(data, "contracts", dict, "project", "an object of module path -> contract text", {})
        for path, text in contracts.items():
            _text(path, "contracts", "module paths", MAX_TEXT_CHARS)
            if not isinstance(text, str):
                raise SchemaError(f"contracts[{path!r}]", "a contract text (string)", text)
            _text(text, f"contracts[{path!r}]", "a contract text")
        runs = _get(data, "runs", list, "project", "a list of runs", [])
        return cls(source, [edit_from_json(e, f"edits[{i}]") for i, e in enumerate(edits)], dict(contracts),
                   [RunRecord.from_json(r, f"runs[{i}]") for i, r in enumerate(runs)])
