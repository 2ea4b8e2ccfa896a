"""A design imported from ONNX with primitive-op nodes is refused by the Rust exporter with the
node and the op named (it was a bare KeyError)."""
from pathlib import Path

import pytest

from engine.interop.export_common import ExportError
from engine.interop.export_rust import export_rust
from engine.interop.onnx_import import import_onnx

ONNX = Path(__file__).resolve().parents[2] / "fixtures" / "onnx"


def test_primitive_ops_have_no_rust_form_and_say_so():
    design = import_onnx(ONNX / "encoder_layer.onnx").design
    with pytest.raises(ExportError, match=r"Op \(\w+\) has no Rust form in this exporter"):
        export_rust(design)
