"""The log dock: log records from any thread shown in the GUI, batched so a chatty stage cannot stall it."""

from __future__ import annotations

import collections
import logging
import threading

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QCheckBox, QDockWidget, QPlainTextEdit, QVBoxLayout, QWidget

logger = logging.getLogger(__name__)

MAX_LINES = 5000
FLUSH_INTERVAL_MS = 100
OWN_PACKAGES = frozenset({"qbstudio", "compiler_core", "root", "__main__"})


class QtLogHandler(logging.Handler, QObject):
    """A logging.Handler that forwards formatted records to the GUI thread through a signal.

    Records are queued (thread-safe) and delivered in batches by a timer every
    ``FLUSH_INTERVAL_MS``, as one ``records`` signal carrying them.

    Signals:
        records(list): ``(logger name, level, formatted line)`` tuples, oldest first.
    """

    records = Signal(list)

    def __init__(self, parent: QObject, level: int = logging.INFO) -> None:
        logging.Handler.__init__(self, level)
        # Parented on purpose: a parentless QObject is freed by Python's cyclic GC, which may run in a
        # worker thread, and a QTimer destroyed off its thread crashes Qt.
        QObject.__init__(self, parent)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"))
        self._pending: collections.deque[tuple[str, int, str]] = collections.deque(maxlen=MAX_LINES)
        self._lock = threading.Lock()
        self._timer = QTimer(self)
        self._timer.setInterval(FLUSH_INTERVAL_MS)
        self._timer.timeout.connect(self.flush_pending)
        self._timer.start()

    def emit(self, record: logging.LogRecord) -> None:
        """Queue one record (called by logging, from any thread)."""
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)
            return
        with self._lock:
            self._pending.append((record.name, record.levelno, line))

    def stop(self) -> None:
        """Stop delivering (the owner is closing); queued lines are dropped."""
        self._timer.stop()

    def flush_pending(self) -> None:
        """Deliver queued lines now (GUI thread)."""
        with self._lock:
            lines = list(self._pending)
            self._pending.clear()
        if lines:
            self.records.emit(lines)


def is_library_noise(name: str, level: int) -> bool:
    """Whether a record is a third-party library's chatter (below WARNING, from outside our packages)."""
    return level < logging.WARNING and name.split(".", 1)[0] not in OWN_PACKAGES


class LogDock(QDockWidget):
    """A dock with the application log: follows new lines, hides library chatter unless asked.

    Lines below WARNING from other packages than ours (onnx_ir, onnxscript, PIL ...) are hidden by
    default; "Show library messages" shows them. The view stays at the newest line unless the user
    scrolled up to read.

    Args:
        handler: The handler whose records are shown (installed on the root logger by the caller).
        parent: Parent widget.
    """

    def __init__(self, handler: QtLogHandler, parent: QWidget | None = None) -> None:
        super().__init__("Log", parent)
        self.setObjectName("logDock")
        self._lines: collections.deque[tuple[str, int, str]] = collections.deque(maxlen=MAX_LINES)
        self.view = QPlainTextEdit(self)
        self.view.setReadOnly(True)
        self.view.setMaximumBlockCount(MAX_LINES)
        self.view.setFont(QFont("monospace", 9))
        self.view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.library_check = QCheckBox("Show library messages", objectName="logShowLibrary")
        self.library_check.setToolTip("Also show INFO/DEBUG lines of third-party libraries (onnx_ir, onnxscript …).")
        self.library_check.toggled.connect(self._rebuild)
        holder = QWidget()
        layout = QVBoxLayout(holder)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.library_check)
        layout.addWidget(self.view, 1)
        self.setWidget(holder)
        handler.records.connect(self.append_records)

    def _shown(self, name: str, level: int) -> bool:
        return self.library_check.isChecked() or not is_library_noise(name, level)

    def append_records(self, records: list[tuple[str, int, str]]) -> None:
        """Append ``(logger name, level, line)`` records; the view follows them unless scrolled up."""
        self._lines.extend(records)
        lines = [line for name, level, line in records if self._shown(name, level)]
        if lines:
            self._append("\n".join(lines))

    def append_lines(self, lines: list[str]) -> None:
        """Append plain lines (always shown)."""
        self.append_records([("qbstudio", logging.INFO, line) for line in lines])

    def _append(self, text: str) -> None:
        bar = self.view.verticalScrollBar()
        follow = bar.value() >= bar.maximum() - 2
        self.view.appendPlainText(text)
        if follow:  # a long line adds a horizontal scroll bar, which Qt's own following misses
            bar.setValue(bar.maximum())

    def start_section(self, title: str) -> None:
        """Start over for another project (earlier lines stay in the log file)."""
        self._lines.clear()
        self.view.clear()
        self.append_lines([f"── {title} ──"])

    def _rebuild(self) -> None:
        self.view.clear()
        lines = [line for name, level, line in self._lines if self._shown(name, level)]
        if lines:
            self._append("\n".join(lines))
        self.view.verticalScrollBar().setValue(self.view.verticalScrollBar().maximum())

    def following(self) -> bool:
        """Whether the newest line is in view (for tests)."""
        bar = self.view.verticalScrollBar()
        return bar.value() == bar.maximum()

    def text(self) -> str:
        """Everything shown (for tests)."""
        return self.view.toPlainText()
