"""Where models come from: a built-in example, a user's Python file with a factory function, a
checkpoint loaded into one of those, or a Hugging Face checkpoint folder (`engine.models`). No Qt
here: the window runs these and shows the errors.

A *source* is one of the typed values of `app.core.schema` (`ExampleSource`, `ScriptSource`,
`CheckpointSource`, `DesignSource`, `PretrainedSource`, `OnnxSource`), kept in the project file.
"""
from __future__ import annotations

import hashlib
import importlib.util
import itertools
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from .schema import (CheckpointSource, DesignSource, ExampleSource, OnnxSource, PretrainedSource, ScriptSource,
                     Source)

DEFAULT_FACTORY = "build"


class OpenError(Exception):
    """A model that could not be made. `details` holds the traceback when user code raised."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.message = message
        self.details = details


def split_script_spec(spec: str) -> tuple[Path, str]:
    """`net.py:build` -> (Path("net.py"), "build"); a bare path uses the `build` factory."""
    text = str(spec)
    head, sep, tail = text.rpartition(":")
    if sep and head and tail.isidentifier() and not tail.startswith(("\\", "/")):
        return Path(head), tail
    return Path(text), DEFAULT_FACTORY


_counter = itertools.count()


def _user_traceback(exc: BaseException, path: Path) -> str:
    """The traceback from the first frame in the user's file on (the app's frames add nothing)."""
    frames = traceback.extract_tb(exc.__traceback__)
    for i, frame in enumerate(frames):
        if Path(frame.filename).resolve() == path.resolve():
            frames = frames[i:]
            break
    lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def load_script(path: str | Path, factory: str = DEFAULT_FACTORY) -> Any:
    """Run the file and call its `factory()`; an `OpenError` carries the user's traceback."""
    path = Path(path)
    if not path.is_file():
        raise OpenError(f"{path}: no such file (expected a Python file with a {factory}() function)")
    name = f"ember_user_model_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise OpenError(f"{path}: not a Python file (expected a .py file with a {factory}() function)")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling look classes up here
    try:
        spec.loader.exec_module(mod)
    except (Exception, SystemExit) as e:  # user code: report, never crash (sys.exit() too)
        sys.modules.pop(name, None)
        raise OpenError(f"{path.name} raised {type(e).__name__} while it was loading: {e}",
                        _user_traceback(e, path)) from e
    fn = getattr(mod, factory, None)
    if not callable(fn):
        found = sorted(n for n, v in vars(mod).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == name)
        raise OpenError(f"{path.name} has no function {factory}(): expected a factory that returns a Module"
                        + (f"; functions found: {', '.join(found)}" if found else ""))
    try:
        model = fn()
    except (Exception, SystemExit) as e:
        raise OpenError(f"{path.name}:{factory}() raised {type(e).__name__}: {e}", _user_traceback(e, path)) from e
    _check_module(model, f"{path.name}:{factory}()")
    return model


def _check_module(model: Any, where: str) -> None:
    from engine.module import Module  # noqa: PLC0415

    if not isinstance(model, Module):
        raise OpenError(f"{where} returned {type(model).__name__}, expected a Module")


# ---- examples ----------------------------------------------------------------------------------
def list_examples() -> list[str]:
    """The names of the built-in examples (resources/examples)."""
    from resources.examples import list_examples as names  # noqa: PLC0415

    return names()


def describe_example(name: str) -> str:
    from resources.examples import describe_example as describe  # noqa: PLC0415

    try:
        return describe(name)
    except Exception:  # a broken example file shows up when it is opened
        return ""


def check_example_name(name: str) -> None:
    """An example name must be one the registry lists (never a path: it is joined into one)."""
    names = list_examples()
    if not isinstance(name, str) or name.strip().lower().replace("_", "-") not in names:
        shown = name if isinstance(name, str) and len(name) <= 80 else repr(name)[:77] + "..."
        raise OpenError(f"unknown example {shown!r}: expected one of {', '.join(names)}")


def load_example(name: str, device=None) -> Any:
    from resources.examples import ExampleError, build_example, example_path  # noqa: PLC0415

    check_example_name(name)
    try:
        path = example_path(name)
    except ExampleError as e:
        raise OpenError(str(e)) from None
    try:
        model = build_example(name, device)
    except (Exception, SystemExit) as e:
        raise OpenError(f"example {name!r} raised {type(e).__name__}: {e}", _user_traceback(e, path)) from e
    _check_module(model, f"example {name!r}")
    return model


def example_input(source: Source | None, batch: int, device=None):
    """The example model's own input batch, or None when its source has none."""
    if not isinstance(source, ExampleSource):
        return None
    from resources.examples import ExampleError  # noqa: PLC0415
    from resources.examples import example_input as make  # noqa: PLC0415

    try:
        return make(source.name, batch, device)
    except ExampleError:
        return None
    except Exception as e:
        raise OpenError(f"example {source.name!r}: example_input() raised {type(e).__name__}: {e}") from e


# ---- running a script a file names --------------------------------------------------------------
# `confirm(path, digest) -> bool`: asked before a Python file named by a project (not chosen by the
# user just now) runs; the window asks the user, remembering the answer per path and content hash.
ConfirmScript = Callable[[Path, str], bool]


def file_digest(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (what a confirmation to run it is remembered by)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def confirm_script(path: str | Path, confirm: ConfirmScript | None) -> None:
    """Refuse (`OpenError`) to run the file unless `confirm` says yes; None refuses too."""
    path = Path(path)
    try:
        if not path.is_file():
            raise OpenError(f"{path}: no such file (expected a Python file with a factory function)")
        digest = file_digest(path)
    except OSError as e:
        raise OpenError(f"{path}: cannot read it ({e.strerror or e})") from None
    if confirm is None or not confirm(path.resolve(), digest):
        raise OpenError(f"{path} was not run: a project names this Python file and running it was not confirmed")


# ---- sources -------------------------------------------------------------------------------------
def build(source: Source, confirm: ConfirmScript | None = None, *, trusted: bool = False) -> Any:
    """Make the module a non-checkpoint source describes (examples, scripts and designs).

    A script runs only when `trusted` (the user chose the file just now) or when `confirm`
    agrees to that file; a source read from a project passes the window's confirmation."""
    if isinstance(source, ExampleSource):
        return load_example(source.name)
    if isinstance(source, ScriptSource):
        if not trusted:
            confirm_script(source.path, confirm)
        return load_script(source.path, source.factory)
    if isinstance(source, CheckpointSource):
        raise OpenError("a checkpoint source needs its weights loaded: use the window's open, not build()")
    if isinstance(source, PretrainedSource):
        return load_pretrained(source.path)
    if isinstance(source, OnnxSource):
        return load_onnx(source.path, source.sha256)[0]
    if isinstance(source, DesignSource):
        from engine.design import BuildError, DesignFileError, build_source  # noqa: PLC0415

        try:
            return build_source(source.to_json())
        except (BuildError, DesignFileError) as e:
            raise OpenError(f"design: {e}") from e
    raise OpenError(f"unknown model source {source!r}: expected example, script, checkpoint, design, pretrained "
                    "or onnx")


def source_for_script(spec: str) -> ScriptSource:
    path, factory = split_script_spec(spec)
    return ScriptSource(str(path.resolve()), factory)


# ---- ONNX files ------------------------------------------------------------------------------------
def import_onnx_file(path: str | Path):
    """`engine.design.import_onnx(path)` and the SHA-256 of the bytes it read (what File ▸ Open
    ONNX… runs on a worker; a project keeps the digest in its `OnnxSource`)."""
    from engine.interop import import_onnx  # noqa: PLC0415

    path = Path(path)
    digest = file_digest(path)
    imported = import_onnx(path)
    if file_digest(path) != digest:  # written to while it was read: neither digest is the weights'
        raise OpenError(f"{path}: the file changed while it was imported; open it again")
    return imported, digest


def build_imported(imported) -> Any:
    """The model of an imported ONNX file: its design built, then its record loaded whole (every
    tensor, nothing partial), so the model holds exactly the file's weights."""
    from engine.design import build_model  # noqa: PLC0415

    return build_model(imported.design).load_record(imported.record)


def load_onnx(path: str | Path, sha256: str | None = None) -> tuple[Any, Any]:
    """Import the ONNX file a project names and build its model with the file's weights:
    (module, imported). `sha256`: the digest the project saved; a file that is missing, cannot
    be imported or changed since raises `OpenError` naming the file."""
    from engine.design import BuildError  # noqa: PLC0415
    from engine.interop.onnx_import import OnnxImportError  # noqa: PLC0415

    path = Path(path)
    if not path.is_file():
        raise OpenError(f"{path}: no such file (expected the ONNX file the model was imported from"
                        + (f", SHA-256 {sha256}" if sha256 else "") + ")")
    try:
        imported, digest = import_onnx_file(path)
    except OSError as e:
        raise OpenError(f"{path}: cannot read it ({e.strerror or e})") from None
    except OnnxImportError as e:
        raise OpenError(f"{path}: cannot be imported: {e}") from None
    if sha256 is not None and digest != sha256:
        raise OpenError(f"{path}: the file changed since the project was saved (expected SHA-256 {sha256}, "
                        f"found {digest}): the project's weights were the earlier file's; open the new file with "
                        "File ▸ Open ONNX… to use it")
    try:
        return build_imported(imported), imported
    except BuildError as e:
        raise OpenError(f"{path}: its design does not build: {e}") from None
    except Exception as e:  # noqa: BLE001 - a record that does not fit the design: say which file
        raise OpenError(f"{path}: its weights do not load into its design: {type(e).__name__}: {e}") from None


# ---- Hugging Face checkpoint folders ---------------------------------------------------------------
def is_pretrained_folder(path: str | Path) -> bool:
    """Whether `path` is a folder (what File ▸ Open Pretrained and a dropped folder open; the
    engine says what is wrong with one that holds no supported model)."""
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False


def is_gguf_file(path: str | Path) -> bool:
    """Whether `path` is a GGUF file (llama.cpp's models: `from_pretrained` opens it, quantized)."""
    try:
        p = Path(path)
        return p.suffix.lower() == ".gguf" and p.is_file()
    except (OSError, ValueError):
        return False


def pretrained_folder_of(path: str | Path) -> Path | None:
    """The model a dropped or named file stands for: a folder itself, or the folder of its
    `config.json` or `model.safetensors.index.json`, or a GGUF file itself; None for anything else."""
    p = Path(path)
    if is_pretrained_folder(p) or is_gguf_file(p):
        return p
    if p.name == "config.json" or p.name.endswith(".safetensors.index.json"):
        return p.parent
    return None


def load_pretrained(path: str | Path, device=None, check: Callable[[], None] | None = None) -> Any:
    """Open a Hugging Face folder (or a GGUF file) with `engine.models.from_pretrained` (lazy: only
    headers are read; a GGUF's quantized weights stay quantized).
    A folder that holds no supported model raises `OpenError` with the engine's message (which
    names the file, the architecture found and the supported ones). `check()` (a worker's
    cancellation check) runs between the layers built; what it raises propagates."""
    from engine.models import from_pretrained  # noqa: PLC0415
    from engine.store.errors import RecordError  # noqa: PLC0415

    path = Path(path)
    if not path.is_dir() and not is_gguf_file(path):
        raise OpenError(f"{path}: no such folder (expected a Hugging Face model folder with config.json and "
                        "its weights, or a .gguf file)")
    try:
        return from_pretrained(path, device, check=check)
    except RecordError as e:  # PretrainedError: what was expected, what was found, where
        raise OpenError(str(e)) from None
    except OSError as e:
        raise OpenError(f"{path}: cannot read it ({e.strerror or e})") from None


def hugging_face_names(module: Any) -> dict[str, str]:
    """{Ember path: Hugging Face name} for the parameters of a model of a known family
    (`engine.models.pretrained_names`) and for the modules above them: a parameter's name less
    as many segments as its path below the module has (`layers.0.self_attn.query` ->
    `model.layers.0.self_attn.q_proj`); of these, the one most parameters give among those that
    prefix every name below (ViT's `encoder.layer.0.attention` holds HF's `attention.attention.*`
    and `attention.output.dense`); none where no such name prefixes them all (BERT's
    `attention.self` holds HF's `attention.self.*` and `attention.output.dense`). {} for any
    other model; nothing is read."""
    if module is None:
        return {}
    try:
        from engine.models import pretrained_names  # noqa: PLC0415

        names = dict(pretrained_names(module))
    except Exception:  # noqa: BLE001 - a model the engine cannot name is shown without names
        return {}
    candidates: dict[str, dict[str, int]] = {}
    below: dict[str, list[list[str]]] = {}  # module path -> the HF names (as segments) of its parameters
    for path, hf in names.items():
        ember, theirs = path.split("."), hf.split(".")
        for depth in range(1, len(ember)):
            key = ".".join(ember[:-depth])
            below.setdefault(key, []).append(theirs)
            if depth < len(theirs):
                votes = candidates.setdefault(key, {})
                name = ".".join(theirs[:-depth])
                votes[name] = votes.get(name, 0) + 1
    out = {}
    for key, parts in below.items():
        if key in names:
            continue
        votes = {name: n for name, n in candidates.get(key, {}).items()
                 if all(segs[:name.count(".") + 1] == name.split(".") for segs in parts)}
        if votes:
            out[key] = max(votes, key=lambda name: (votes[name], -len(name)))
    out.update(names)
    return out


def save_pretrained_refusal(module: Any) -> str:
    """Why `module` cannot be written as a Hugging Face folder ('' when it can): a model of no
    family `engine.models` knows has no Hugging Face names."""
    if module is None:
        return "no model is open"
    if hugging_face_names(module):
        return ""
    return (f"this model ({type(module).__name__}) is not from a Hugging Face family Ember knows "
            f"({', '.join(_supported())}): open one with File ▸ Open Pretrained")


def _supported() -> list[str]:
    try:
        from engine.models import supported_architectures  # noqa: PLC0415

        return supported_architectures()
    except Exception:  # noqa: BLE001
        return []


def save_pretrained(module: Any, folder: str | Path, progress: Callable[[float], None] | None = None) -> tuple[Path, int]:
    """Write `module` as a Hugging Face folder (`engine.models.save_pretrained`). A model with
    LoRA/QLoRA adapters is materialized first, on a copy (the caller's model is unchanged); returns
    the folder and how many adapted weights were merged."""
    from engine.models import save_pretrained as save  # noqa: PLC0415

    from engine.module.tree import params  # noqa: PLC0415

    progress = progress or (lambda f: None)
    merged = sum(1 for _, p in params(module) if p.reparameterization is not None)
    model = module.materialize() if merged else module
    progress(0.3)
    written = save(model, folder)
    progress(1.0)
    return Path(written), merged
