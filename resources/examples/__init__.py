"""Example models a user can open by name.

Each example is a plain Python file beside this one (`burn_book.py`, `burn_mnist.py`, ...)
with a `build(device=None) -> Module` factory, and optionally `example_input(batch, device=None)`
giving a batch the model accepts and `DESCRIPTION`, a one-line summary. The files are loaded
by path, so the folder works the same installed as a package or checked out.

    from resources.examples import list_examples, build_example, example_input
    model = build_example("burn-mnist")
    logits = model.forward(example_input("burn-mnist", batch=4))
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["ExampleError", "list_examples", "build_example", "example_input", "describe_example", "example_path",
           "example_task"]

_HERE = Path(__file__).resolve().parent
_LOADED: dict[str, object] = {}


class ExampleError(LookupError):
    """An example name that no file answers to, or an example without the asked-for function."""


def _file_name(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def list_examples() -> list[str]:
    """The example names (`burn-book`, `burn-mnist`, `llama-7b`, `transformer`), sorted."""
    names = []
    for path in _HERE.glob("*.py"):
        if path.name.startswith("_"):
            continue
        names.append(path.stem.replace("_", "-"))
    return sorted(names)


def example_path(name: str) -> Path:
    """The file that defines the example `name`: one the registry lists, never a path (a
    project's `../../x` or `/tmp/x` would otherwise run any `.py` on disk)."""
    if not isinstance(name, str) or _file_name(name).replace("_", "-") not in list_examples():
        raise ExampleError(f"unknown example {name!r}: expected one of {list_examples()}")
    path = _HERE / f"{_file_name(name)}.py"
    if not path.is_file() or path.name.startswith("_"):
        raise ExampleError(f"unknown example {name!r}: expected one of {list_examples()}")
    return path


def _module(name: str):
    path = example_path(name)
    key = path.stem
    mod = _LOADED.get(key)
    if mod is None:
        spec = importlib.util.spec_from_file_location(f"ember_example_{key}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _LOADED[key] = mod
    return mod


def build_example(name: str, device=None):
    """A fresh model of the example `name` on `device` (the default device when None)."""
    mod = _module(name)
    if not hasattr(mod, "build"):
        raise ExampleError(f"example {name!r} ({example_path(name)}) defines no build(device) function")
    return mod.build(device)


def example_input(name: str, batch: int = 1, device=None):
    """An input batch of `batch` items that the example `name` accepts in `forward`."""
    mod = _module(name)
    fn = getattr(mod, "example_input", None)
    if fn is None:
        raise ExampleError(f"example {name!r} ({example_path(name)}) defines no example_input(batch) function")
    return fn(batch, device)


def describe_example(name: str) -> str:
    """The example's one-line description (empty when it has none)."""
    return str(getattr(_module(name), "DESCRIPTION", ""))


def example_task(name: str) -> str | None:
    """The built-in training task the example `name` pairs with (`task()`), or None."""
    fn = getattr(_module(name), "task", None)
    return None if fn is None else str(fn())
