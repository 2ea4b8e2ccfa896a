"""Help ▸ User Guide: a Markdown document shown in a dialog (QTextBrowser's own Markdown
rendering; images and links resolved beside the file, web links opened in the browser)."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTextBrowser, QVBoxLayout


class GuideDialog(QDialog):
    def __init__(self, path: str | Path, parent=None, *, title: str = "User Guide"):
        """`path`: the Markdown file; one that cannot be read is named in the dialog."""
        super().__init__(parent)
        self.setObjectName("guide-dialog")
        self.setWindowTitle(title)
        self.path = Path(path)
        self.browser = QTextBrowser()
        self.browser.setObjectName("guide")
        self.browser.setOpenExternalLinks(True)
        self.browser.setSearchPaths([str(self.path.parent)])
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            text = f"# {title}\n\nThe guide could not be read: `{self.path}`: {exc}"
        self.browser.document().setBaseUrl(QUrl.fromLocalFile(str(self.path.parent) + "/"))
        self.browser.setMarkdown(text)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.browser)
        layout.addWidget(buttons)
        self.resize(820, 640)

    def headings(self) -> list[str]:
        """The text of every heading block the browser shows (what the Markdown rendered to)."""
        out = []
        block = self.browser.document().begin()
        while block.isValid():
            if block.blockFormat().headingLevel() > 0:
                out.append(block.text())
            block = block.next()
        return out
