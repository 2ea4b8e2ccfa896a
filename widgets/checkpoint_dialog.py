"""Choosing a checkpoint to load: the file, whether a partial fit is acceptable, and (to open a
checkpoint as a new model) the architecture to load it into."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QHBoxLayout,
                               QLineEdit, QToolButton, QVBoxLayout, QWidget)

from .common import ErrorLabel

SCRIPT = "__script__"
CHECKPOINT_FILTER = "Checkpoints (*.bpk *.safetensors);;All files (*)"


WEIGHT_SUFFIXES = (".bpk", ".safetensors")
TRAINING_STATE = ("optimizer.bpk", "scheduler.bpk")  # beside a training checkpoint's model.bpk


def checkpoint_in(folder: Path) -> tuple[Path | None, str]:
    """The checkpoint file a chosen folder stands for, else (None, why not): a training
    checkpoint folder (`epoch-<e>/`) its `model.bpk`, a folder holding one .bpk or .safetensors
    file that file; for any other folder what it holds and what is expected."""
    expected = "expected a checkpoint file (.bpk, or .safetensors in the PyTorch layout)"
    if (folder / "model.bpk").is_file():
        return folder / "model.bpk", ""
    if (folder / "adapter_config.json").is_file():
        return None, (f"{folder} is a PEFT adapter folder (adapter_config.json), not a checkpoint file: "
                      f"{expected}")
    found = sorted(p for p in folder.iterdir() if p.suffix.lower() in WEIGHT_SUFFIXES and p.is_file()
                   and p.name not in TRAINING_STATE)
    if len(found) == 1:
        return found[0], ""
    if not found:
        return None, f"{folder} is a folder holding no .bpk or .safetensors file: {expected}"
    names = ", ".join(p.name for p in found[:4]) + (" …" if len(found) > 4 else "")
    return None, f"{folder} is a folder holding {len(found)} checkpoint files ({names}): choose one of them"


class CheckpointDialog(QDialog):
    """Emits `chosen(dict)`: `{"path", "allow_partial", "architecture"}`; the architecture is
    None when importing into the open model, else `{"kind": "example", "name"}` or
    `{"kind": "script", "spec": "path.py:factory"}`."""

    chosen = Signal(dict)

    def __init__(self, parent=None, *, examples: list[str] | None = None, title: str = "Import Checkpoint",
                 current: dict | None = None):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.setObjectName("checkpoint-dialog")
        self.with_architecture = examples is not None
        self.start_folder = ""  # where Browse starts while no path is given (the window's last folder)
        form = QFormLayout()
        self.architecture = QComboBox()
        self.architecture.setObjectName("architecture")
        self.script = QLineEdit()
        self.script.setObjectName("script")
        self.script.setPlaceholderText("/path/to/model.py:build")
        self.architecture_error = ErrorLabel()
        if self.with_architecture:
            for name in examples or []:
                self.architecture.addItem(f"example: {name}", name)
            self.architecture.addItem("Python file with a factory…", SCRIPT)
            form.addRow("Architecture", self.architecture)
            form.addRow("Factory", self.script)
            form.addRow("", self.architecture_error)
        self.path = QLineEdit()
        self.path.setObjectName("path")
        self.path.setPlaceholderText("weights.bpk or model.safetensors (PyTorch layout)")
        browse = QToolButton()
        browse.setText("…")
        browse.clicked.connect(self._browse)
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(browse)
        holder = QWidget()
        holder.setLayout(row)
        row.setContentsMargins(0, 0, 0, 0)
        self.path_error = ErrorLabel()
        self.allow_partial = QCheckBox("Allow partial: load what fits, report what is missing or unused")
        self.allow_partial.setObjectName("allow_partial")
        form.addRow("Checkpoint", holder)
        form.addRow("", self.path_error)
        form.addRow("", self.allow_partial)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.buttons)
        self.buttons.accepted.connect(self._accept)
        self.buttons.rejected.connect(self.reject)
        self.architecture.currentIndexChanged.connect(self._sync)
        if self.with_architecture and current:  # start on the open model's architecture
            self.set_architecture(current)
        self.resize(560, 0)
        self._sync()

    def set_architecture(self, arch: dict) -> None:
        """Choose `{"kind": "example", "name"}` or `{"kind": "script", "spec"}` (unknown: kept as is)."""
        if arch.get("kind") == "example":
            at = self.architecture.findData(arch.get("name"))
            if at >= 0:
                self.architecture.setCurrentIndex(at)
        elif arch.get("kind") == "script" and arch.get("spec"):
            self.architecture.setCurrentIndex(self.architecture.findData(SCRIPT))
            self.script.setText(str(arch["spec"]))
        self._sync()

    def _sync(self, *_):
        self.script.setEnabled(self.with_architecture and self.architecture.currentData() == SCRIPT)

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Checkpoint", self.path.text() or self.start_folder,
                                              CHECKPOINT_FILTER)
        if path:
            self.path.setText(path)

    def choice(self) -> dict | None:
        """The choice, or None with the errors shown next to the fields."""
        ok = True
        path = Path(self.path.text().strip()).expanduser()
        if not self.path.text().strip():
            self.path_error.show_error("choose a checkpoint file")
            ok = False
        elif path.is_dir():  # a folder: the checkpoint it holds (a training checkpoint's model.bpk)
            found, why = checkpoint_in(path)
            if found is None:
                self.path_error.show_error(why)
                ok = False
            else:
                path = found
                self.path.setText(str(found))
                self.path_error.show_error(None)
        elif not path.is_file():
            self.path_error.show_error(f"{path}: no such file (expected a .bpk checkpoint file, or .safetensors "
                                       f"in the PyTorch layout)")
            ok = False
        else:
            self.path_error.show_error(None)
        architecture = None
        if self.with_architecture:
            data = self.architecture.currentData()
            if data == SCRIPT:
                spec = self.script.text().strip()
                file = Path(spec.rsplit(":", 1)[0] if ":" in Path(spec).name else spec).expanduser()
                if not spec:
                    self.architecture_error.show_error("give the Python file (and factory) that builds the model")
                    ok = False
                elif not file.is_file():
                    self.architecture_error.show_error(f"{file}: no such file")
                    ok = False
                else:
                    self.architecture_error.show_error(None)
                    architecture = {"kind": "script", "spec": spec}
            else:
                architecture = {"kind": "example", "name": data}
        if not ok:
            return None
        return {"path": str(path), "allow_partial": self.allow_partial.isChecked(), "architecture": architecture}

    def _accept(self) -> None:
        c = self.choice()
        if c is not None:
            self.chosen.emit(c)
            self.accept()
