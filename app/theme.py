"""Fusion style with a light or a dark palette."""
from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

_DARK = {
    QPalette.ColorRole.Window: "#2b2d30",
    QPalette.ColorRole.WindowText: "#dfe1e5",
    QPalette.ColorRole.Base: "#1e1f22",
    QPalette.ColorRole.AlternateBase: "#26282b",
    QPalette.ColorRole.ToolTipBase: "#3c3f41",
    QPalette.ColorRole.ToolTipText: "#dfe1e5",
    QPalette.ColorRole.PlaceholderText: "#868a91",
    QPalette.ColorRole.Text: "#dfe1e5",
    QPalette.ColorRole.Button: "#35373b",
    QPalette.ColorRole.ButtonText: "#dfe1e5",
    QPalette.ColorRole.BrightText: "#ff6b68",
    QPalette.ColorRole.Link: "#589df6",
    QPalette.ColorRole.Highlight: "#2f65ca",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.Light: "#45484d",
    QPalette.ColorRole.Midlight: "#3c3f43",
    QPalette.ColorRole.Mid: "#303236",
    QPalette.ColorRole.Dark: "#1b1c1f",
    QPalette.ColorRole.Shadow: "#0f1012",
}
_DARK_DISABLED = {
    QPalette.ColorRole.WindowText: "#6f737a",
    QPalette.ColorRole.Text: "#6f737a",
    QPalette.ColorRole.ButtonText: "#6f737a",
    QPalette.ColorRole.HighlightedText: "#9a9da3",
}


def palette(name: str) -> QPalette:
    """The palette of a theme: `light` is Fusion's own, `dark` a low-contrast dark grey."""
    if name == "light":
        from PySide6.QtWidgets import QStyleFactory  # noqa: PLC0415

        return QStyleFactory.create("Fusion").standardPalette()
    if name != "dark":
        raise ValueError(f"unknown theme {name!r}: expected 'light' or 'dark'")
    pal = QPalette()
    for role, color in _DARK.items():
        pal.setColor(QPalette.ColorGroup.All, role, QColor(color))
    for role, color in _DARK_DISABLED.items():
        pal.setColor(QPalette.ColorGroup.Disabled, role, QColor(color))
    return pal


def apply_theme(app: QApplication, name: str) -> None:
    app.setStyle("Fusion")
    app.setPalette(palette(name))

