"""The welcome page shown while nothing is open: the pipeline in one picture, the sample, import, recent work."""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_PROJECT = ROOT / "resources" / "samples" / "fashion_cnn.qbproj"
DOCS_DIR = ROOT / "docs"
MAX_RECENT_ROWS = 10
"""The recent list grows to this many rows, then scrolls."""
PIPELINE = (("Model", "ONNX, PyTorch, TF"), ("Parse", "to MBLT"), ("Check", "per device"),
            ("Calibrate", "your data"), ("Quantize", "int8 / int16"), ("Compile", "to an MXQ"))


def pipeline_html() -> str:
    """The compile pipeline as one row of boxes (rich text)."""
    cells = []
    for index, (title, text) in enumerate(PIPELINE):
        if index:
            cells.append("<td valign='middle' style='color:#888'>&nbsp;&#8594;&nbsp;</td>")
        cells.append(f"<td style='border:1px solid #90a4ae;background:#eceff1;padding:6px' align='center'>"
                     f"<b>{title}</b><br><small>{text}</small></td>")
    return f"<table cellspacing='0'><tr>{''.join(cells)}</tr></table>"


class WelcomePage(QWidget):
    """First-run page: what the workbench does, and the ways to start.

    Signals:
        sample_requested(): open the bundled sample project.
        import_requested(): import a model.
        open_requested(): open a project or model file.
        recent_requested(str): open a recent project (its path).
    """

    sample_requested = Signal()
    import_requested = Signal()
    open_requested = Signal()
    recent_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="welcomePage")
        title = QLabel("<h1>qb Studio</h1><p>Compile a trained model for a Mobilint-style NPU: parse it, see which "
                       "layers the device runs, calibrate with your data, quantize and compile to an MXQ, and "
                       "compare runs. Everything runs on this computer, offline.</p>", wordWrap=True)
        picture = QLabel(pipeline_html(), objectName="pipelinePicture")
        self.sample_button = QPushButton("Open the sample project", objectName="welcomeSample")
        self.sample_button.setToolTip(f"A small Fashion-MNIST CNN with calibration images ({SAMPLE_PROJECT.name})")
        self.sample_button.setEnabled(SAMPLE_PROJECT.is_file())
        self.sample_button.clicked.connect(self.sample_requested)
        self.import_button = QPushButton("Import a model…", objectName="welcomeImport")
        self.import_button.clicked.connect(self.import_requested)
        self.open_button = QPushButton("Open a project…", objectName="welcomeOpen")
        self.open_button.clicked.connect(self.open_requested)
        self.recent = QListWidget(objectName="welcomeRecent")
        # a long path is elided in its middle (the tooltip has it whole): a horizontal scroll bar hid the rows
        self.recent.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.recent.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.no_recent = QLabel("No recent projects yet: they are listed here once you open or save one.",
                                objectName="welcomeNoRecent", styleSheet="color: #666;")
        self.recent.itemActivated.connect(self._on_recent_activated)  # double-click or Enter (both, it opened twice)
        docs = QLabel(f"Documentation shipped with the app: <a href='{DOCS_DIR.as_uri()}'>{DOCS_DIR}</a> "
                      f"(also Help › Documentation). Drop a model or project file anywhere on the window (and, once a "
                      "model is open, its calibration folder).",
                      wordWrap=True, openExternalLinks=True)
        self._layout(title, picture, docs)

    def _layout(self, title: QLabel, picture: QLabel, docs: QLabel) -> None:
        buttons = QHBoxLayout()
        for button in (self.sample_button, self.import_button, self.open_button):
            button.setMinimumHeight(34)
            buttons.addWidget(button)
        buttons.addStretch(1)
        column = QVBoxLayout()
        column.addWidget(title)
        column.addWidget(picture)
        column.addSpacing(12)
        column.addLayout(buttons)
        column.addSpacing(12)
        column.addWidget(QLabel("<b>Recent projects</b> (untitled ones are autosaved)"))
        column.addWidget(self.recent)
        column.addWidget(self.no_recent)
        column.addSpacing(12)
        column.addWidget(docs)
        column.addStretch(1)
        holder = QWidget()
        holder.setLayout(column)
        holder.setMaximumWidth(900)
        outer = QHBoxLayout(self)
        outer.addWidget(holder, 1)

    def _on_recent_activated(self, item: QListWidgetItem | None) -> None:
        path = item.data(Qt.ItemDataRole.UserRole) if item is not None else None
        if path:  # after this signal returns: opening refills (clears) the list that holds ``item``
            QTimer.singleShot(0, lambda: self.recent_requested.emit(path))

    def set_recent(self, entries: list[tuple[str, str]]) -> None:
        """Show ``(label, path)`` recent projects, newest first (the list is as tall as its entries)."""
        self.recent.clear()
        for label, path in entries:
            item = QListWidgetItem(label)
            item.setData(Qt.ItemDataRole.UserRole, path)
            item.setToolTip(path)
            self.recent.addItem(item)
        rows = min(len(entries), MAX_RECENT_ROWS)
        self.recent.setFixedHeight(self.recent.sizeHintForRow(0) * rows + 2 * self.recent.frameWidth() + 4
                                   if rows else 0)
        self.recent.setVisible(bool(entries))
        self.no_recent.setVisible(not entries)
