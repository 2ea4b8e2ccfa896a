"""Controllers without the window (issue 44, item 4): a controller takes the Document and any
object that keeps the host protocol (app/host.py); none imports main_window.py."""
from app.document import Document
from app.edit_actions import EditActions
from app.host import Host
from tests.widgets.models import Mlp


class RecordingHost:
    """A host with no window: it records what the controller said."""

    settings = None
    tasks = None
    last_message = None

    def __init__(self):
        self.notes: list[str] = []
        self.errors: list[tuple[str, str]] = []

    def status(self, text: str, ms: int = 8000) -> None:
        self.notes.append(text)

    def message(self, icon, title: str, text: str, details: str = ""):
        self.notes.append(f"{title}: {text}")

    def error(self, title: str, text: str, details: str = ""):
        self.errors.append((title, text))

    def open_dialog(self, dialog):
        return dialog

    def dialog_parent(self):
        return None

    def maybe_discard(self, document: bool = True, design: bool = False) -> bool:
        return True


def test_an_edit_controller_works_with_a_host_that_is_not_the_window(qtbot):
    host: Host = RecordingHost()
    doc = Document()
    doc.set_model(Mlp(), None)
    trainable = doc.stats.total.trainable
    edits = EditActions(doc, host, current_path=lambda: "blocks.0")
    assert edits.group_op("freeze", "blocks.0")
    assert doc.stats.total.trainable == trainable - (8 * 16 + 16)  # blocks.0's weight and bias froze
    assert host.notes and "blocks.0" in host.notes[-1] and host.errors == []
    assert edits.detach_lora() is False  # nothing attached: the engine's refusal goes to the host
    assert host.errors and host.errors[-1][0] == "Edit failed"
    doc.undo_stack.undo()
    assert doc.stats.total.trainable == trainable
