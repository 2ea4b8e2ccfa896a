"""Where models come from: a built-in example, a user's Python file with a factory function, or a
checkpoint loaded into one of those. No Qt here: the window runs these and shows the errors.

A *source* is a small dict kept in the project file:
`{"kind": "example", "name": "burn-book"}`,
`{"kind": "script", "path": "/home/me/net.py", "factory": "build"}`,
`{"kind": "checkpoint", "path": "w.bpk", "architecture": <a source>, "allow_partial": False}`.
"""
from __future__ import annotations

import importlib.util
import itertools
import sys
import traceback
from pathlib import Path
from typing import Any

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "resources" / "examples"
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
    """The names of the built-in examples (files in resources/examples with a build())."""
    if not EXAMPLES_DIR.is_dir():
        return []
    names = []
    for p in sorted(EXAMPLES_DIR.glob("*.py")):
        if p.name.startswith("_"):
            continue
        names.append(p.stem.replace("_", "-"))
    return names


def example_path(name: str) -> Path:
    return EXAMPLES_DIR / (name.replace("-", "_") + ".py")


def load_example(name: str) -> Any:
    path = example_path(name)
    if not path.is_file():
        known = ", ".join(list_examples()) or "none installed"
        raise OpenError(f"no example named {name!r}: expected one of {known}")
    return load_script(path, DEFAULT_FACTORY)


# ---- sources -------------------------------------------------------------------------------------
def build(source: dict) -> Any:
    """Make the module a non-checkpoint source describes (examples and scripts)."""
    kind = source.get("kind")
    if kind == "example":
        return load_example(source["name"])
    if kind == "script":
        return load_script(source["path"], source.get("factory", DEFAULT_FACTORY))
    if kind == "checkpoint":
        raise OpenError("a checkpoint source needs its weights loaded: use the window's open, not build()")
    raise OpenError(f"unknown model source {kind!r}: expected example, script or checkpoint")


def source_for_script(spec: str) -> dict:
    path, factory = split_script_spec(spec)
    return {"kind": "script", "path": str(path.resolve()), "factory": factory}
