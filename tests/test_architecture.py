"""The layering contracts (pyproject.toml, `lint-imports`): engine imports no Qt, widgets or app;
widgets import no app; app.core imports no Qt or widgets; the engine's packages form layers (docs/architecture.md);
only the CPU door (engine/tensor/cpu) loads numba and threadpoolctl, and the rest reaches its modules through it."""
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_linter_contracts_hold():
    exe = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(ROOT / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    assert f"{len(contracts)} kept, 0 broken" in result.stdout, result.stdout
    assert "engine.shapes imports nothing of the engine KEPT" in result.stdout, result.stdout
    assert "only the CPU door loads numba, llvmlite and threadpoolctl KEPT" in result.stdout, result.stdout
    assert "the CPU door's threads, BLAS and compiled kernels are reached through the door KEPT" in result.stdout
    assert "app.core knows nothing about Qt or the widgets KEPT" in result.stdout, result.stdout
    assert "engine layers: " in result.stdout, result.stdout


def test_engine_imports_without_qt():
    code = "import sys, engine, engine.nn, engine.module, engine.store, engine.optim, engine.train; " \
           "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'widgets', 'app')]; " \
           "assert not bad, bad"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_engine_layers_contract_lists_only_documented_exceptions():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    layers = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    assert [c["layers"][-1] for c in layers] == ["engine.autodiff"]
    # each exception is a lazy import made inside a method (engine.module -> engine.store records)
    assert layers[0].get("ignore_imports", []) == ["engine.module.module -> engine.store.module_io"]


def test_the_architecture_notes_examples_run():
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)
    assert blocks, "docs/architecture.md shows the tree walk with a python example"
    for code in blocks:
        exec(compile(code, str(ROOT / "docs" / "architecture.md"), "exec"), {"__name__": "architecture_example"})


def test_only_the_tensor_and_autodiff_packages_read_a_tensors_slots():
    """Everything else goes through the public Tensor API or engine.tensor.raw (item 5 of issue 17)."""
    import re

    slot = re.compile(r"\.(_data|_node|_device)\b|Tensor\._wrap\b|_tape\._state\b")
    found = []
    for package in ("engine", "app", "widgets"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(("engine/tensor/", "engine/autodiff/")):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if slot.search(line.replace("self._node(", "")):  # Design._node is the design graph's own
                    found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
