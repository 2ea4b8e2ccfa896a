"""ONNX export by tracing, and the traced graph of any model.

- `trace_model(model, inputs, shape_only=False)`: one forward pass of `model` recorded op by op
  (`engine.tensor.trace`), each op under the module path it ran in, parameters and constants
  named by their paths; `trace.calls` lists every module call with the tensors it took and
  returned (the module-level graph, with a shape on every edge) and the range of its ops. `shape_only=True` runs no layer kernel and allocates no parameter: a
  built-in layer is one op (`module`, its type in `attrs["type"]`) whose output dims its shape
  rule gives (`engine.design.shape_check`); the glue between layers runs on zero-stride
  stand-ins. That is the graph of a lazy 7 B model in well under a second.
- `export_onnx(model_or_design, path, example_input, dynamic_batch=True, opset=17, *, dynamic_sequence,
  with_cache, input_names, output_names, max_length)`: a Design is
  built first; a model with LoRA / QLoRA adapters is exported materialized (on a copy, in
  `valid()` mode). Initializers are named by parameter path, node names carry the module path
  (`layers.0.self_attn/MatMul_3`); the model is checked with `onnx.checker` and written
  atomically. An op with no ONNX form raises `OnnxExportError` naming the op and the module path.
  With `dynamic_batch`, axis 0 of the inputs and outputs is `batch`: the forward is traced twice,
  at the example's batch B and at B + 1, and every size that differs between the two traces (a
  reshape's target, an expanded class token, zeros made at the batch's size) is computed from the
  input's batch in the graph, so a batch size that equals another size is still told apart. A
  model that runs different ops at another batch size, or makes a constant whose rows differ with
  the batch, is refused with a message saying so (export it with `dynamic_batch=False`).
  A language model gets `input_ids` / `attention_mask` in, `logits` out, dynamic batch and
  sequence axes, and with `with_cache=True` the `past_key_values` / `present` tensors
  (`onnx_export.language`), its token positions read from the mask (`onnx_export.positions`);
  `input_names` / `output_names` rename any model's inputs and outputs. Every run-time size is read
  from an input axis of that form where one has it, and the run-time-sized values carry their
  named dims (value_info), so `import_onnx` reads the file back.
"""

from .tracing import OnnxExportError, trace_model
from .writer import export_onnx, trace_to_onnx

__all__ = ["export_onnx", "trace_model", "trace_to_onnx", "OnnxExportError"]
