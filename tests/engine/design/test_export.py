"""Code export: the Python module reproduces the design's outputs; the Rust file equals the
reviewed golden files (and is rustfmt-clean where rustfmt is installed)."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor
from engine.design import Design, build_model, mnist_design, residual_design
from engine.interop import ExportError, export_python, export_rust
from engine.module import ShapeError

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(f"exported_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _branchy_design() -> Design:
    d = Design("Branchy")
    d.add_node("Input", "x", {"shape": ["batch", "seq", 8]})
    d.add_node("Split", "split", {"dim": -1, "sizes": [3, 5]})
    d.add_node("Linear", "proj", {"d_input": 3, "d_output": 5})
    d.add_node("Add", "sum")
    d.add_node("Concat", "cat", {"dim": 2})
    d.add_node("Flatten", "flat", {"start_dim": 1})
    d.add_node("Reshape", "back", {"shape": ["batch", "seq", -1]})
    d.add_node("Output", "out")
    d.add_node("Output", "flat_out")
    d.connect("x", "output", "split", "input")
    d.connect("split", "out0", "proj", "input")
    d.connect("proj", "output", "sum", "in0")
    d.connect("split", "out1", "sum", "in1")
    d.connect("sum", "output", "cat", "in0")
    d.connect("x", "output", "cat", "in1")
    d.connect("cat", "output", "flat", "input")
    d.connect("flat", "output", "back", "input")
    d.connect("back", "output", "out", "input")
    d.connect("flat", "output", "flat_out", "input")
    return d


@pytest.mark.parametrize("make, shape", [(mnist_design, (3, 28, 28)), (residual_design, (3, 64)),
                                         (_branchy_design, (2, 4, 8))])
def test_exported_python_reproduces_the_design(tmp_path, make, shape):
    design = make()
    source = export_python(design)
    path = tmp_path / f"{design.name.lower()}_export.py"
    path.write_text(source)
    mod = _import(path)
    exported = mod.build()
    built = build_model(design)
    assert type(exported).__name__ == design.name
    assert [p for p, _ in exported.named_params()] == [p for p, _ in built.named_params()]
    exported = exported.load_record(built.into_record())
    x = Tensor.random(shape, ("normal", 0.0, 1.0))
    want = built.valid().forward(x)
    got = exported.valid().forward(x)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    # two implementations of one model (the design's graph walk and the exported source): equal
    # up to float32 rounding, not bit for bit, since BLAS kernels and NumPy's SIMD loops depend on
    # the CPU and on memory layout (a view or a copy before a matmul)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)
    # typed fields, a Shapes docstring, and assert_shape at the boundaries
    assert "# Shapes" in source and "assert_shape(" in source
    assert f"class {design.name}(Module):" in source
    doc = exported.forward.__doc__
    assert "# Shapes" in doc
    with pytest.raises(ShapeError):
        exported.forward(Tensor.zeros(shape[:-1] + (shape[-1] + 1,)))


def test_exported_python_has_typed_fields(tmp_path):
    source = export_python(mnist_design())
    assert "    conv1: Conv1Block\n" in source and "    fc1: nn.Linear\n" in source
    assert "    conv: nn.Conv2d\n" in source


@pytest.mark.parametrize("make, golden", [(mnist_design, "mnist_design.rs"), (residual_design, "residual_design.rs")])
def test_exported_rust_equals_the_reviewed_golden_file(make, golden):
    assert export_rust(make()) == (GOLDEN / golden).read_text()


@pytest.mark.skipif(shutil.which("rustfmt") is None, reason="rustfmt is not installed")
@pytest.mark.parametrize("golden", ["mnist_design.rs", "residual_design.rs"])
def test_golden_rust_is_rustfmt_clean(golden):
    result = subprocess.run(["rustfmt", "--edition", "2024", "--check", str(GOLDEN / golden)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rust_export_of_branches_clones_all_but_the_last_use():
    rust = export_rust(_branchy_design())
    assert "pub fn forward(&self, x: Tensor<3>) -> (Tensor<3>, Tensor<2>) {" in rust
    assert "let [batch, seq, _] = x.dims();" in rust
    assert "let split_out0 = x.clone().narrow(2, 0, 3);" in rust
    assert "let split_out1 = x.clone().narrow(2, 3, 5);" in rust
    assert "let cat_2 = Tensor::cat(vec![sum, x], 2);" in rust  # `cat` is taken by the import
    assert "let flat = cat_2.flatten::<2>(1, 2);" in rust
    assert "let back = flat.clone().reshape([batch, seq, 13]);" in rust
    assert "assert_shape!(flat, [batch, 13 * seq]);" in rust
    assert rust.rstrip().endswith("(back, flat)\n    }\n}")


def test_exports_refuse_incomplete_or_unmapped_designs():
    d = mnist_design()
    d.set_field("fc1", "d_input", 10)
    with pytest.raises(ExportError, match="fc1: assert_shape"):
        export_rust(d)
    with pytest.raises(ExportError, match="fc1: assert_shape"):
        export_python(d)
    d = residual_design()
    d.add_node("Celu", "celu")
    d.connect("norm", "output", "celu", "input")
    d.connect("celu", "output", "head", "input")
    with pytest.raises(ExportError, match="celu: Celu has no Burn counterpart in the Rust exporter"):
        export_rust(d)
    assert "nn.Celu" in export_python(d) or "nn.CeluConfig" in export_python(d)
