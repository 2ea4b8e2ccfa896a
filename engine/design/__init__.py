"""Designing models as dataflow graphs: no Qt here, the designer's views live in widgets/designer.

    from engine.design import Design, analyze, build_model, save_design, read_design
    d = Design("Model")
    d.add_node("Input", "input", {"shape": ["batch", 8]})
    d.add_node("Linear", "fc1", {"d_input": 8, "d_output": 4})
    d.add_node("Output", "output")
    d.connect("input", "output", "fc1", "input")
    d.connect("fc1", "output", "output", "input")
    analyze(d).output_shapes()["output"].text()   # '[batch, 4]'
    model = build_model(d)                          # an engine Module: fields fc1, ...

- `catalog`: the node kinds (every layer of engine.nn, from its `…Config`; structural nodes);
- `graph`: the `Design` (networkx) and its edits, refusing cycles;
- `shapes`: live shape inference with named axes, errors at the node;
- `build`: the design as a Module (dotted names nest: `conv1.conv` -> `conv1.conv.weight`);
- `files`: design files with schema versions and migration, autosave and recovery;
- `primitive`: the `Op` node kind (one ONNX-style operator, what an imported graph is made of);
- `shape_rules`: the `Op` node's shape rule (a layer's own rule is declared beside its class, `engine.nn.spec`);
- `shape_check`: a model's shape contract checked by the layers' rules.

Interchange (ONNX import and export, Python, Rust and training-script export) lives in
`engine.interop`, one room up: it imports this package, never the other way.
"""
from .catalog import CATEGORIES, NodeSpec, UnknownKind, catalog, kinds, spec_for
from .fields import FieldError, FieldSpec
from .graph import Design, DesignError, check_node_name
from .layout import auto_layout
from .shapes import Analysis, NodeState, SymTensor, analyze, format_dims
from .build import BuildError, DesignBlock, DesignModel, build_model
from .files import (SCHEMA_VERSION, DesignFileError, Recovery, design_from_source, design_source, discard_autosave,
                    is_design_data, list_autosaves, migrate, read_design, save_design, write_autosave)
from .samples import SAMPLES, mnist_design, residual_design


def build_source(source: dict, device=None):
    """The model a project source of kind "design" describes (for the app's opening code)."""
    return build_model(design_from_source(source), device)


__all__ = [
    "CATEGORIES", "NodeSpec", "UnknownKind", "catalog", "kinds", "spec_for", "FieldError", "FieldSpec", "Design",
    "DesignError", "check_node_name", "auto_layout", "Analysis", "NodeState", "SymTensor", "analyze", "format_dims",
    "BuildError", "DesignBlock", "DesignModel", "build_model", "SCHEMA_VERSION", "DesignFileError", "Recovery",
    "design_from_source", "design_source", "discard_autosave", "is_design_data", "list_autosaves", "migrate",
    "read_design", "save_design", "write_autosave", "SAMPLES", "mnist_design", "residual_design", "build_source",
]
