"""Model edits from the window: freeze / unfreeze / no-grad, LoRA, materialize, device moves and
detach. Each becomes one undo step on the document (`app.core.edits` performs it); an edit that
copies a lot runs on a worker. The LoRA and group dialogs emit the edit's JSON form (widgets do
not import the app), read here with the schema.

Before an edit that allocates (LoRA factors, QLoRA's dense bases and NF4 weights, a Fork or
Transfer of initialized parameters, Materialize) runs, its memory is estimated
(`engine.module.memory`: a walk of the tree that reads no value, milliseconds on a 7 B model,
so it runs here) and compared with what the machine has (`memory.available_memory()`); an edit
that would not fit is refused with the figures and the model stays as it was. A lazy model's
Fork or Transfer allocates nothing and is never refused."""
from __future__ import annotations

from typing import Callable

from engine.module import memory
from widgets.group_dialog import GroupDialog
from widgets.lora_dialog import LoraDialog

from .core import edits
from .core.schema import (DetachEdit, Edit, GroupEdit, GroupSpec, LoraEdit, MaterializeEdit, MoveEdit,
                          edit_from_json)
from .document import Document
from .host import Host
from .workers import BackgroundTask


class EditActions:
    def __init__(self, document: Document, host: Host, *, current_path: Callable[[], str]):
        """`current_path()`: the module path selected in the tree ('' for the whole model)."""
        self.host = host
        self.document = document
        self.current_path = current_path

    def apply_edit(self, edit: Edit) -> bool:
        """Perform an edit on the document's module as one undoable step; errors go to a dialog and
        change nothing."""
        module = self.document.module
        if module is None:
            return False
        estimate = self.memory_estimate(module, edit)
        if estimate is not None and estimate.total:
            refusal = estimate.refusal(memory.available_memory())
            if refusal:
                text = edits.describe(edit)
                self.host.error("Not enough memory", f"{text}: {refusal}. The model was left as it was.")
                self.host.status(f"{text}: refused, it needs about {memory.size_text(estimate.total)}")
                return False
        if edits.edit_cost_bytes(module, edit) > edits.HEAVY_EDIT_BYTES:
            self._apply_in_background(module, edit, estimate)
            return True
        try:
            after = edits.apply_edit(module, edit)
        except Exception as e:  # noqa: BLE001 - the engine's message, shown; the model is unchanged
            self.host.error("Edit failed", f"{edits.describe(edit)} failed: {type(e).__name__}: {e}")
            return False
        self.document.push_module(edits.describe(edit), after, edit)
        self.host.status(edits.describe(edit))
        return True

    @staticmethod
    def memory_estimate(module, edit: Edit) -> "memory.MemoryEstimate | None":
        """What `edit` will allocate on `module` (None for an edit that allocates nothing, or
        whose group cannot be read: applying it says why)."""
        try:
            if isinstance(edit, LoraEdit):
                return memory.estimate_lora(module, edits.lora_config(edit))
            if isinstance(edit, MoveEdit):
                return memory.estimate_move(module, edit.device, edit.fork)
            if isinstance(edit, MaterializeEdit):
                return memory.estimate_materialize(module)
        except (edits.EditError, ValueError, TypeError):
            return None
        return None

    def _apply_in_background(self, module, edit: Edit, estimate=None) -> BackgroundTask:
        """A long edit (a move that copies gigabytes, QLoRA packing) on a worker thread: the
        window stays responsive, and the result becomes one undoable step when it arrives, unless
        the model was changed meanwhile (then it is dropped and the status bar says so)."""
        w, text = self.host, edits.describe(edit)

        def done(after):
            self.document.push_module(text, after, edit)
            w.status(text)

        w.status(f"{text}… ({estimate.text()})" if estimate is not None and estimate.total else f"{text}…")
        return w.tasks.start(BackgroundTask(lambda state: edits.apply_edit(module, edit), title=text), done,
                             lambda f: w.error("Edit failed", f"{text} failed: {f}"),
                             valid_while=lambda: self.document.module is module,
                             dropped=f"{text}: the model changed while it ran; the result was dropped.")

    def group_op(self, op: str, path: str, spec: GroupSpec | None = None) -> bool:
        """Freeze, unfreeze or stop gradients for `spec`, or for everything at or below `path`."""
        return self.apply_edit(GroupEdit(op, spec if spec is not None else GroupSpec.subtree(path)))

    def move_to(self, device: str, fork: bool) -> bool:
        if not device:
            return False
        return self.apply_edit(MoveEdit(device, fork=fork))

    def detach_lora(self) -> bool:
        """Detach LoRA from the selected module's parameters (the whole model when nothing is
        selected): one undoable edit that removes those adapters and keeps every other change."""
        return self.apply_edit(DetachEdit(GroupSpec.subtree(self.current_path())))

    # ---- dialogs ---------------------------------------------------------------------------------
    def open_group_dialog(self) -> GroupDialog | None:
        w = self.host
        if self.document.module is None:
            return None
        path = self.current_path()
        dialog = GroupDialog(self.document.module, w.dialog_parent(), mode="regex" if path else "all",
                             text=GroupSpec.subtree(path).pattern)
        dialog.group_chosen.connect(lambda op, spec: self.group_op(op, path, GroupSpec.from_json(spec)))
        return w.open_dialog(dialog)

    def open_lora_dialog(self, path: str = "") -> LoraDialog | None:
        w = self.host
        if self.document.module is None:
            return None
        spec = GroupSpec.subtree(path)
        dialog = LoraDialog(self.document.module, w.dialog_parent(), group_mode=spec.kind, group_text=spec.pattern)
        dialog.lora_chosen.connect(lambda data: self.apply_edit(edit_from_json(data)))
        return w.open_dialog(dialog)
