"""File ▸ Open from the Hugging Face Hub…: a model id ('org/name', a revision optional) downloaded
into the Hugging Face cache on a worker (`engine.models.hub.download`: config, tokenizer and
safetensors weights), with its progress in the status bar and Cancel there stopping it; then
opened as File ▸ Open Pretrained… opens a folder (lazily, on a worker). The project records the
cache's snapshot folder, which opens again without the network."""
from __future__ import annotations

from pathlib import Path

from widgets.hub_id_dialog import HubIdDialog

from .document import Document
from .host import Host
from .workers import BackgroundTask

TITLE = "Open from the Hugging Face Hub"


class HubOpen:
    def __init__(self, document: Document, host: Host, *, open_folder):
        """`open_folder(folder, ask=False)`: File ▸ Open Pretrained's open of a folder
        (`PretrainedActions.open_folder`)."""
        self.document = document
        self.host = host
        self.open_folder = open_folder
        self.last_id = ""

    def ask(self) -> HubIdDialog:
        dialog = HubIdDialog(self.host.dialog_parent(), repo_id=self.last_id)
        dialog.chosen.connect(lambda repo_id, revision: self.open_id(repo_id, revision))
        return self.host.open_dialog(dialog)

    def open_id(self, repo_id: str, revision: str = "", ask: bool = True) -> BackgroundTask | None:
        """Download `repo_id` (at `revision`, '' for the default branch) on a worker, then open it.
        `ask`: ask about unsaved work first."""
        w = self.host
        if ask and not w.maybe_discard(document=True):
            return None
        self.last_id = repo_id

        def work(state):
            from huggingface_hub import snapshot_download  # noqa: PLC0415 - only a Hub open loads it

            from engine.models import hub  # noqa: PLC0415

            state.set_status(f"Downloading {repo_id}…")
            return hub.download(snapshot_download, repo_id, revision=revision or None,
                                progress=state.set_progress, check=state.check_cancelled)

        def downloaded(folder: Path) -> None:
            w.status(f"Downloaded {repo_id} into {folder}; opening it")
            self.open_folder(folder, ask=False)

        def failed(failure) -> None:
            exc = failure.exception
            from engine.store.errors import RecordError  # noqa: PLC0415

            if isinstance(exc, RecordError):  # PretrainedError: not found, gated, offline, no config.json
                w.error(TITLE, str(exc))
            else:
                w.error(TITLE, f"{repo_id}: {type(exc).__name__}: {exc}", failure.traceback)

        doc, was, step = self.document, self.document.module, self.document.undo_stack.index()
        return w.tasks.start(BackgroundTask(work, title=f"Downloading {repo_id}"), downloaded, failed, kind="open",
                             valid_while=lambda: doc.module is was and doc.undo_stack.index() == step,
                             dropped=f"Downloading {repo_id}: the open model was changed meanwhile, so it was kept "
                                     f"and {repo_id} was not opened.")
