"""File ▸ Open from the Hugging Face Hub… (issue 48, item 11): a model id is downloaded on a worker
with its progress shown and Cancel stopping it, then opened. No network: the Hub's
`snapshot_download` is replaced by one that copies the fixture Llama folder in small chunks,
through the progress class the app hands it, as the library does."""
from __future__ import annotations

import fnmatch
import threading

import huggingface_hub
import pytest

from app.workers import Cancelled
from tests.app.window_helpers import LLAMA, wait_idle
from widgets.hub_id_dialog import HubIdDialog


class FakeHub:
    """`snapshot_download`'s signature; copies the allowed files of the fixture folder into a
    cache folder 512 bytes an update, `pause()` called after each update."""

    def __init__(self, cache, pause=lambda: None):
        self.cache, self.pause = cache, pause
        self.calls: list[dict] = []
        self.threads: list[str] = []
        self.raised: list[BaseException] = []

    def __call__(self, repo_id, *, revision=None, token=None, cache_dir=None, local_files_only=False,
                 allow_patterns=None, tqdm_class=None):
        self.calls.append({"repo_id": repo_id, "revision": revision, "patterns": list(allow_patterns or [])})
        self.threads.append(threading.current_thread().name)
        if repo_id == "nobody/missing":
            raise huggingface_hub.errors.LocalEntryNotFoundError("cannot reach the Hub and the files are not cached")
        folder = self.cache / repo_id.replace("/", "--") / (revision or "main")
        folder.mkdir(parents=True, exist_ok=True)
        files = [p for p in sorted(LLAMA.iterdir())
                 if any(fnmatch.fnmatch(p.name, pat) for pat in allow_patterns or ["*"])]
        bar = tqdm_class(total=sum(p.stat().st_size for p in files), unit="B", desc="Downloading")
        try:
            for p in files:
                data = p.read_bytes()
                with open(folder / p.name, "wb") as out:
                    for at in range(0, len(data), 512):
                        out.write(data[at:at + 512])
                        bar.update(len(data[at:at + 512]))
                        self.pause()
        except BaseException as exc:
            self.raised.append(exc)
            raise
        finally:
            bar.close()
        return str(folder)


@pytest.fixture
def hub(monkeypatch, tmp_path):
    fake = FakeHub(tmp_path / "cache")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    return fake


def test_a_hub_id_downloads_on_a_worker_with_progress_then_opens(window, qtbot, hub):
    window.actions.open_hub.trigger()
    dialog = window.dialog
    assert isinstance(dialog, HubIdDialog)
    open_button = dialog.buttons.buttons()[0]
    dialog.repo_id.setText("not an id")
    assert not open_button.isEnabled() and "expected a Hub model id 'org/name'" in dialog.error.text()
    progress: list[float] = []
    started = []
    real_start = window.tasks.start

    def spy(task, *args, **kwargs):
        if task.title.startswith("Downloading"):
            task.progress.connect(progress.append)
        started.append(task.title)
        return real_start(task, *args, **kwargs)

    window.tasks.start = spy
    dialog.repo_id.setText("tiny-org/llama-gqa")
    assert open_button.isEnabled()
    open_button.click()
    qtbot.waitUntil(lambda: window.document.module is not None, timeout=60_000)
    wait_idle(qtbot, window, 60_000)
    assert started == ["Downloading tiny-org/llama-gqa", "Opening main"]  # then opened as a folder is
    assert hub.calls[0]["repo_id"] == "tiny-org/llama-gqa" and "model.safetensors" in hub.calls[0]["patterns"]
    assert hub.threads[0] != threading.main_thread().name  # downloaded on a worker
    assert len(progress) > 10 and progress == sorted(progress) and progress[-1] == pytest.approx(1.0)
    assert type(window.document.module).__name__ == "LlamaForCausalLM"
    assert window.document.source.path == str(hub.cache / "tiny-org--llama-gqa" / "main")
    assert not (hub.cache / "tiny-org--llama-gqa" / "main" / "expected.npz").exists()  # only what was asked


def test_cancel_stops_the_download_and_opens_nothing(window, qtbot, monkeypatch, tmp_path):
    cancel = threading.Event()
    first = threading.Event()

    def pause():
        first.set()
        cancel.wait(0.01)

    fake = FakeHub(tmp_path / "cache", pause)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    task = window.hub_open.open_id("tiny-org/slow")
    assert first.wait(30)
    task.cancel()
    wait_idle(qtbot, window, 60_000)
    assert window.document.module is None  # nothing opened
    assert len(fake.raised) == 1 and isinstance(fake.raised[0], Cancelled)  # the download itself stopped
    assert window.last_message is None  # a cancel is no error


def test_a_missing_repo_is_named(window, qtbot, hub):
    window.hub_open.open_id("nobody/missing")
    wait_idle(qtbot, window, 60_000)
    box = window.last_message
    assert box is not None and "nobody/missing" in box.text() and "LocalEntryNotFoundError" in box.text()
    assert window.document.module is None
