"""The log dock: log records from any thread shown in the GUI, batched so a chatty stage cannot stall it."""

from __future__ import annotations

import collections
import logging
import threading

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QDockWidget, QPlainTextEdit, QWidget

logger = logging.getLogger(__name__)

MAX_LINES = 5000
FLUSH_INTERVAL_MS = 100


class QtLogHandler(logging.Handler, QObject):
    """A logging.Handler that forwards formatted records to the GUI thread through a signal.

    Records are queued (thread-safe) and delivered in batches by a timer every
    ``FLUSH_INTERVAL_MS``, as one ``records`` signal carrying the lines.

    Signals:
        records(list): formatted lines, oldest first.
    """

    records = Signal(list)

    def __init__(self, parent: QObject, level: int = logging.INFO) -> None:
        logging.Handler.__init__(self, level)
        # Parented on purpose: a parentless QObject is freed by Python's cyclic GC, which may run in a
        # worker thread, and a QTimer destroyed off its thread crashes Qt.
        QObject.__init__(self, parent)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"))
        self._pending: collections.deque[str] = collections.deque(maxlen=MAX_LINES)
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
            self._pending.append(line)

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


class LogDock(QDockWidget):
    """A dock with the application log (INFO and above by default).

    Args:
        handler: The handler whose records are shown (installed on the root logger by the caller).
        parent: Parent widget.
    """

    def __init__(self, handler: QtLogHandler, parent: QWidget | None = None) -> None:
        super().__init__("Log", parent)
        self.setObjectName("logDock")
        self.view = QPlainTextEdit(self)
        self.view.setReadOnly(True)
        self.view.setMaximumBlockCount(MAX_LINES)
        self.view.setFont(QFont("monospace", 9))
        self.view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setWidget(self.view)
        handler.records.connect(self.append_lines)

    def append_lines(self, lines: list[str]) -> None:
        """Append lines at the end."""
        self.view.appendPlainText("\n".join(lines))

    def text(self) -> str:
        """Everything shown (for tests)."""
        return self.view.toPlainText()
