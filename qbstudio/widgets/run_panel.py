"""The compile controls: Compile / Cancel, stage progress, elapsed time, and the summary of the last run."""

from __future__ import annotations

import logging
import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from compiler_core.progress import ProgressEvent
from qbstudio.widgets.fit import fit_width
from qbstudio.widgets.summary import CompileSummary

logger = logging.getLogger(__name__)


class RunPanel(QWidget):
    """Compile button, progress of the running compile, and its summary.

    Signals:
        compile_requested(): the user pressed Compile.
        cancel_requested(): the user pressed Cancel.
        offload_requested(): the user asked to run the unsupported head/tail layers on the CPU.
    """

    compile_requested = Signal()
    cancel_requested = Signal()
    offload_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.compile_button = QPushButton("Compile", objectName="compileButton")
        self.compile_button.setStyleSheet("QPushButton { font-weight: bold; padding: 4px 18px; }")
        self.compile_button.clicked.connect(self.compile_requested)
        self.cancel_button = QPushButton("Cancel", objectName="cancelButton", enabled=False)
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.stage_label = fit_width(QLabel("Idle", objectName="stageLabel"))
        self.elapsed_label = QLabel("", objectName="elapsedLabel")
        self.progress = QProgressBar(objectName="stageProgress")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.reason_label = fit_width(QLabel("", objectName="compileBlocked"))
        self.reason_label.setStyleSheet("color: #b26a00")
        self.offload_button = QPushButton("Offload head/tail to CPU", objectName="offloadButton")
        self.offload_button.setToolTip("Turn on CPU offload: the unsupported layers at the start and end of the "
                                       "graph run on the host CPU, the rest on the NPU.")
        self.offload_button.clicked.connect(self.offload_requested)
        self.offload_button.hide()
        self.summary = CompileSummary(self)
        self._started = 0.0
        self._shown_before = None  # the run the summary showed before a job: shown again if the job ends without one
        self._clock = QTimer(self, interval=200)
        self._clock.timeout.connect(self._tick)
        self._build()

    def _build(self) -> None:
        buttons = QHBoxLayout()  # top-aligned: a stage message that wraps grows downwards, the buttons stay put
        top = Qt.AlignmentFlag.AlignTop
        buttons.addWidget(self.compile_button, 0, top)
        buttons.addWidget(self.cancel_button, 0, top)
        buttons.addWidget(self.stage_label, 1, top)
        buttons.addWidget(self.elapsed_label, 0, top)
        layout = QVBoxLayout(self)
        layout.addLayout(buttons)
        blocked = QHBoxLayout()
        blocked.addWidget(self.reason_label, 1)
        blocked.addWidget(self.offload_button)
        layout.addLayout(blocked)
        layout.addWidget(self.progress)
        scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)  # long advice scrolls, never
        scroll.setWidget(self.summary)  # pushes the window past a laptop screen
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # the rows wrap instead
        layout.addWidget(scroll, 1)

    @property
    def running(self) -> bool:
        """Whether a compile is shown as running."""
        return self._clock.isActive()

    def started(self, *, compiling: bool = True) -> None:
        """Switch to the running state (``compiling``: the summary says a new run is coming; else it stays)."""
        self._started = time.perf_counter()
        self._shown_before = self.summary.run
        self.compile_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.stage_label.setText("Starting…")
        self.progress.setRange(0, 0)
        self._clock.start()
        self._tick()
        if compiling:
            self.summary.show_running()

    def reset(self) -> None:
        """Idle, no outcome, no summary: another project or model is open."""
        self._clock.stop()
        self._started = 0.0
        self._shown_before = None
        self.stage_label.setText("Idle")
        self.elapsed_label.setText("")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.summary.show_run(None)

    def show_progress(self, event: ProgressEvent) -> None:
        """Show one progress event (busy indicator when the total is unknown)."""
        text = event.message or event.stage
        self.stage_label.setToolTip(text)
        self.stage_label.setText(f"<b>{event.stage}</b> — {text}" if text != event.stage else f"<b>{text}</b>")
        if event.total:
            self.progress.setRange(0, event.total)
            self.progress.setValue(min(event.done, event.total))
        else:
            self.progress.setRange(0, 0)

    def finished(self, outcome: str, *, complete: bool | None = None) -> None:
        """Back to idle, showing ``outcome`` (``Done``, ``Cancelled``, ``Failed: ...``); the bar is full when the job
        ran to the end (``complete``; by default when ``outcome`` is ``Done``).

        The summary shows the run it showed before the job again (a new run, when there is one, replaces it).
        """
        self._clock.stop()
        if self.summary.run is None:
            self.summary.show_run(self._shown_before)
        self._tick()
        self.compile_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.stage_label.setText(outcome)
        self.stage_label.setToolTip(outcome)
        self.progress.setRange(0, 1)
        self.progress.setValue(1 if (outcome == "Done" if complete is None else complete) else 0)

    def set_can_compile(self, enabled: bool, reason: str = "", *, offload_helps: bool = False) -> None:
        """Enable Compile (when idle); ``reason`` says why not; offer the offload fix when it would help."""
        self.compile_button.setEnabled(enabled and not self.running)
        self.compile_button.setToolTip(reason)
        self.reason_label.setText("" if enabled else reason)
        self.reason_label.setVisible(not enabled and bool(reason))
        self.offload_button.setVisible(not enabled and offload_helps)

    def _tick(self) -> None:
        if self._started:
            self.elapsed_label.setText(f"{time.perf_counter() - self._started:.1f} s")
