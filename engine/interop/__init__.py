"""Interchange: models and designs to and from other formats and other frameworks' code.

    from engine.interop import export_onnx, import_onnx, export_python, export_rust
    imported = import_onnx("model.onnx")      # .design, .record, .report
    export_onnx(model, "model.onnx", inputs)  # ONNX by tracing

- `onnx_import`: `import_onnx(path)` -> `.design`, `.record`, `.report`; one handler per ONNX op
  family, registered by op type (`onnx_import.handlers`);
- `onnx_export`: `export_onnx` (ONNX by tracing) and `trace_model` (the traced op graph of any model);
- `export_python` / `export_rust` (with `export_common`): a design as code for Ember and for Burn;
- `training_script`: a PyTorch training script for a Hugging Face model and its PEFT adapter.

This room sits above `engine.design` (the designer's graph, catalog and symbolic shapes) and
`engine.models` (the pretrained families): it imports them, they never import it. A new file
format (GGUF) is a new module here; a chat template is `engine.train.chat_template` (training renders
conversations with it). docs/architecture.md has the rule.
"""
from .export_common import ExportError
from .export_python import export_python
from .export_rust import export_rust
from .onnx_import import ImportedOnnx, ImportReport, OnnxImportError, import_onnx
from .onnx_export import OnnxExportError, export_onnx, trace_model
from .training_script import CONFIG_FILE, export_training_script

__all__ = [
    "ExportError", "export_python", "export_rust", "ImportedOnnx", "ImportReport", "OnnxImportError", "import_onnx",
    "OnnxExportError", "export_onnx", "trace_model", "CONFIG_FILE", "export_training_script",
]
