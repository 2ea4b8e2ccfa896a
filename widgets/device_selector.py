"""The device combo: pick a device and fork or transfer the model to it."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QToolButton, QWidget

FORK_TIP = ("Fork to the device: independent parameters there, detached from the original graph, "
            "with their gradient retention restored. Use it to train on the destination.")
TRANSFER_TIP = ("Transfer to the device: the move is recorded by autodiff, so gradients flow back to "
                "the original parameters; the moved copies do not retain gradients themselves. "
                "Uninitialized (lazy) parameters just change where they will be created.")


class DeviceSelector(QWidget):
    """A combo of the available devices with Fork and Transfer buttons.

    Emits `fork_requested(device)` and `transfer_requested(device)`; it changes nothing itself.
    """

    fork_requested = Signal(str)
    transfer_requested = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.label = QLabel("device:")
        self.combo = QComboBox()
        self.combo.setObjectName("device-combo")
        self.combo.setToolTip("Where the model's parameters live. Pick a device, then Fork or Transfer.\n\n"
                              + FORK_TIP + "\n\n" + TRANSFER_TIP)
        self.fork_button = QToolButton()
        self.fork_button.setText("Fork")
        self.fork_button.setToolTip(FORK_TIP)
        self.transfer_button = QToolButton()
        self.transfer_button.setText("Transfer")
        self.transfer_button.setToolTip(TRANSFER_TIP)
        self.model_label = QLabel("")
        self.model_label.setObjectName("model-devices")
        for w in (self.label, self.combo, self.fork_button, self.transfer_button, self.model_label):
            layout.addWidget(w)
        self.fork_button.clicked.connect(lambda: self.fork_requested.emit(self.device()))
        self.transfer_button.clicked.connect(lambda: self.transfer_requested.emit(self.device()))

    def set_devices(self, names: list[str]) -> None:
        current = self.device()
        self.combo.blockSignals(True)
        self.combo.clear()
        self.combo.addItems(names)
        if current in names:
            self.combo.setCurrentText(current)
        self.combo.blockSignals(False)

    def devices(self) -> list[str]:
        return [self.combo.itemText(i) for i in range(self.combo.count())]

    def device(self) -> str:
        return self.combo.currentText()

    def set_model_devices(self, names: list[str]) -> None:
        """Show where the model lives now, and select that device when it is only one."""
        if not names:
            self.model_label.setText("")
        else:
            self.model_label.setText("model on " + ", ".join(names))
        if len(names) == 1 and names[0] in self.devices():
            self.combo.setCurrentText(names[0])

    def set_enabled_actions(self, enabled: bool) -> None:
        self.fork_button.setEnabled(enabled)
        self.transfer_button.setEnabled(enabled)
