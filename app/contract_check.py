"""The shape-contract side of the window: the contract editor follows the selection, edits go to
the document as undo steps, and Check runs an example input through the model on a worker with
a check at every module boundary (`engine.module.contracts`)."""
from __future__ import annotations

from typing import Any

from engine.design import shape_check
from engine.module import contracts, memory
from engine import nn
from engine.module.tree import FieldKind, find
from engine.module.tree import children as tree_children
from engine.train.text import model_limits
from engine.tensor.device import default_device
from widgets.contract_editor import ContractEditor
from widgets.module_tree import CONTRACT, ModuleTree

from .core import opening
from .core.schema import ExampleSource
from .document import Document
from .host import Host
from .workers import BackgroundTask


SHAPES_ONLY_FROM = 64 * 2**20  # lazy parameters above this size make "Shapes only" the check's default


TOKEN_EXAMPLE_LENGTH = 8  # positions of a language model's default example input (fewer when it has fewer)


def first_layer(module: Any):
    """The first layer a forward reaches, in the tree's order: the first module below the root
    that has no module children (an Embedding for a language model)."""
    for _path, m in module.named_modules():
        if m is module:
            continue
        if not any(kind is FieldKind.MODULE for _n, kind, _v in tree_children(m)):
            return m
    return None


def default_example_input(contract_text: str | None, module: Any) -> str:
    """The contract editor's default example input: integer token ids `int[2, L]` (L within the
    model's positions) for a model whose first layer is an Embedding (a language model), else
    the shape its contract gives (`[batch, 784]` -> `[2, 784]`)."""
    if isinstance(first_layer(module), nn.Embedding):
        _vocab, positions = model_limits(module)
        length = min(TOKEN_EXAMPLE_LENGTH, positions) if positions else TOKEN_EXAMPLE_LENGTH
        return f"int[2, {max(1, length)}]"
    return contracts.example_input_text(contract_text, module) or image_example_input(module)


def image_example_input(module: Any) -> str:
    """`[2, C, H, W]` for a model whose config gives its images (`num_channels`, `image_size`:
    ViT), else ''."""
    config = getattr(module, "config", None)
    channels, size = getattr(config, "num_channels", None), getattr(config, "image_size", None)
    if not isinstance(channels, int) or size is None:
        return ""
    sides = (size, size) if isinstance(size, int) else tuple(size)
    if len(sides) != 2 or not all(isinstance(x, int) and x > 0 for x in sides):
        return ""
    return f"[2, {channels}, {sides[0]}, {sides[1]}]"


class ContractCheck:
    def __init__(self, document: Document, host: Host, *, editor: ContractEditor, tree: ModuleTree, dock):
        """`editor`: the contract editor this drives; `tree`: the module tree (its selection, its
        contract column); `dock`: the dock that holds the editor (shown where a check failed)."""
        self.host = host
        self.document = document
        self.editor = editor
        self.tree = tree
        self.dock = dock
        self.editor.set_validators(self.validate_contract, self.validate_example_input)
        self._mode_for: int | None = None  # id of the model the check mode's default was set for

    # ---- the editor follows the selection and the document -----------------------------------
    def show_contract(self, path: str, found) -> None:
        doc = self.document
        if found is None or found[0] not in (FieldKind.MODULE, FieldKind.REPARAMETERIZATION):
            self.editor.set_target(None, None, None, False)
        else:
            doc_text = contracts.docstring_contract(found[1])
            edited = doc.contracts.get(path)
            self.editor.set_target(path, edited or doc_text, doc_text, edited is not None)
        self.show_check_result()
        if doc.module is not None and id(doc.module) != self._mode_for:
            # shapes only by default for a model whose parameters are not allocated (llama-7b): where
            # the full check would allocate more than SHAPES_ONLY_FROM bytes of lazy parameters
            self._mode_for = id(doc.module)
            self.editor.set_shapes_only(shape_check.unallocated_bytes(doc.module) > SHAPES_ONLY_FROM)
        default = "example" if isinstance(doc.source, ExampleSource) else \
            default_example_input(doc.contract_for("", doc.module), doc.module)
        self.editor.set_example_input(default)

    def on_contracts_changed(self) -> None:
        tree = self.tree
        tree.model.refresh_column(CONTRACT)
        path = tree.selected_path() or ""
        if self.document.module is not None:
            self.show_contract(path, find(self.document.module, path))

    def on_check_changed(self) -> None:
        self.tree.model.refresh_column(CONTRACT)
        self.show_check_result()

    def show_check_result(self) -> None:
        r = self.document.check_result
        if r is None:
            self.editor.show_result(None, "", "")
            return
        if r.ok and r.not_checked:
            self.editor.show_result(None, f"⚠ shapes checked up to {r.not_checked[0]}",
                                    "\n".join(r.not_checked) + "\n\nshapes that flowed:\n" + r.flow_text())
        elif r.ok:
            shapes = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in r.output_shapes)
            how = " (shapes only: no layer ran, no parameter was allocated)" if r.shape_only else ""
            self.editor.show_result(True, f"✓ every contract held; output {shapes}{how}", r.flow_text())
        else:
            where = r.failure.path if r.failure else "the model"
            self.editor.show_result(False, f"✗ {where or '(the whole model)'}: {r.error}",
                                    r.error + "\n\nshapes up to the failure:\n" + r.flow_text())

    def contract_info(self, path: str, module: Any) -> tuple[str | None, str, str]:
        """What the tree's contract column shows: the contract, and the last check's status there."""
        text = self.document.contract_for(path, module)
        r = self.document.check_result
        if r is None or path not in r.nodes:
            return text, "", ""
        node = r.nodes[path]
        return text, node.status, node.message

    def edit_contract(self, path: str) -> None:
        self.tree.select_path(path)
        self.dock.show()
        self.dock.raise_()
        self.editor.edit.setFocus()
        self.editor.edit.selectAll()

    # ---- validation and the check ------------------------------------------------------------
    @staticmethod
    def validate_contract(text: str) -> str | None:
        try:
            contracts.parse_contract(text)
        except contracts.ContractSyntaxError as e:
            return str(e)
        return None

    def validate_example_input(self, text: str) -> str | None:
        try:
            spec = contracts.parse_example_input(text)
        except contracts.ContractSyntaxError as e:
            return str(e)
        if spec == contracts.EXAMPLE and not isinstance(self.document.source, ExampleSource):
            return "'example' needs a model opened from the examples; give shapes such as [2, 784]"
        return None

    def _check_failed(self, f) -> None:
        self.editor.show_result(False, f"✗ {f}", "")
        self.host.error("Check failed", str(f), f.traceback)

    def run_check(self, input_text: str) -> BackgroundTask | None:
        """Run the example input through the model with checks at every module boundary, on a
        worker. A new check replaces a running one; a result for a model that changed meanwhile is
        dropped."""
        w, doc = self.host, self.document
        module = doc.module
        if module is None:
            return None
        err = self.validate_example_input(input_text)
        if err:
            self.editor.input_error.show_error(err)
            self.dock.show()
            return None
        spec = contracts.parse_example_input(input_text)
        devices = module.devices()
        device = devices[0] if devices else default_device()
        source = doc.source
        shapes_only = self.editor.shapes_only.isChecked()
        modules = list(module.named_modules())
        wanted = {p: doc.contract_for(p, m) for p, m in modules}
        wanted = {p: t for p, t in wanted.items() if t}
        bad = {p: self.validate_contract(t) for p, t in wanted.items()}
        bad = {p: e for p, e in bad.items() if e}
        if bad:
            path, e = next(iter(bad.items()))
            w.error("Check", f"the contract of {path or 'the model'} cannot be read: {e}")
            return None

        def work(state):
            if spec == contracts.EXAMPLE:
                inputs = [opening.example_input(source, 2, device)]
                if inputs[0] is None:
                    raise ValueError(f"the example {source.name!r} has no example_input(); give shapes")
            else:
                inputs = contracts.make_example_input(spec, device)
            if shapes_only:
                return shape_check.check_shapes(module, inputs, wanted, modules, checkpoint=state.check_cancelled)
            if shape_check.unallocated_bytes(module) > SHAPES_ONLY_FROM:
                # the full check allocates every parameter and the activations: refuse what cannot fit
                # (the activations' figure comes from a shape-only pass, which allocates nothing)
                shapes = shape_check.check_shapes(module, inputs, wanted, modules, checkpoint=state.check_cancelled)
                memory.MemoryEstimate("The full check", {
                    "parameters to allocate": shape_check.unallocated_bytes(module),
                    "activations for the check input": shape_check.activation_bytes(shapes),
                }).check(memory.available_memory())  # MemAvailable, and what RLIMIT_AS leaves
            return contracts.check(module, inputs, wanted, modules, checkpoint=state.check_cancelled)

        def done(result):
            doc.set_check_result(result)
            if result.failure is not None:
                self.tree.select_path(result.failure.path)
                self.dock.show()
            w.status(("Check: not everything could be checked" if result.not_checked else
                      "Check: every contract held") if result.ok else f"Check failed at "
                     f"{result.failure.path if result.failure else 'the model'}")

        self.editor.show_result(None, "Checking…", "")
        return w.tasks.start(BackgroundTask(work, title="Checking shape contracts"), done,
                             self._check_failed, kind="check",
                             valid_while=lambda: doc.module is module,
                             dropped="The model changed while it was being checked; the result was dropped.")
