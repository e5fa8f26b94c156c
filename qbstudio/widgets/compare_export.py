"""The export actions of Runs & Compare: copy a run as a command or as Python, export the report or the CSV.

Each action is one function taking the widget it runs from; failures become a message box (never a
traceback) and successes a status-bar message when the widget sits in a main window.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QMainWindow, QMenu, QWidget

from compiler_core.errors import QBCompilerError
from qbstudio import dialogs
from qbstudio.state.run_export import copy_text, write_layers_csv, write_report
from qbstudio.state.runs import RunRecord

logger = logging.getLogger(__name__)

COPY_KINDS = {"command": "Copy as command", "python": "Copy as Python"}
COPY_TIPS = {"command": "Put the `qbcompiler compile` command that rebuilds this run's MXQ byte for byte on the "
                        "clipboard (it writes to the run's MXQ path)",
             "python": "Put the `mxq_compile(...)` call that rebuilds this run's MXQ byte for byte on the clipboard "
                       "(it writes to the run's MXQ path)"}


def add_copy_actions(menu: QMenu, parent: QWidget, run: RunRecord, prefix: str = "") -> None:
    """Add "Copy as command" and "Copy as Python" for ``run`` to ``menu``."""
    for kind, text in COPY_KINDS.items():
        action = menu.addAction(f"{prefix}{text}")
        action.setObjectName(f"copy-{kind}-{run.run_id}")
        action.setToolTip(COPY_TIPS[kind])
        action.triggered.connect(lambda _=False, k=kind: copy_run(parent, run, k))
    menu.setToolTipsVisible(True)


def copy_run(parent: QWidget, run: RunRecord, kind: str) -> str | None:
    """Put ``run``'s reproduction (``command`` or ``python``) on the clipboard; the text, or None on error."""
    from PySide6.QtGui import QGuiApplication

    try:
        text = copy_text(run, kind)
    except (QBCompilerError, OSError) as error:
        dialogs.show_error(parent, f"Cannot reproduce {run.label}", error)
        return None
    QGuiApplication.clipboard().setText(text)
    _status(parent, f"{run.label}: the {'command' if kind == 'command' else 'Python call'} that rebuilds its MXQ "
                    "is on the clipboard")
    return text


def export_report(parent: QWidget, runs: Sequence[RunRecord], *, baseline: int = 0, order: Sequence[str] = (),
                  model: str = "", path: str | Path | None = None) -> Path | None:
    """Write the HTML report of ``runs`` (asks for ``path`` when None); the file, or None."""
    target = path or _ask_path(parent, "Export report", runs, "runs-report.html", "HTML report (*.html)")
    if not target:
        return None
    try:
        written = write_report(runs, target, baseline=baseline, order=order, model=model)
    except (QBCompilerError, OSError) as error:
        dialogs.show_error(parent, "Report not written", error)
        return None
    _status(parent, f"Report written to {written}")
    return written


def export_csv(parent: QWidget, runs: Sequence[RunRecord], *, order: Sequence[str] = (),
               path: str | Path | None = None) -> Path | None:
    """Write the per-layer CSV of ``runs`` (asks for ``path`` when None); the file, or None."""
    target = path or _ask_path(parent, "Export per-layer CSV", runs, "runs-layers.csv", "CSV (*.csv)")
    if not target:
        return None
    try:
        written = write_layers_csv(runs, target, order=order)
    except (QBCompilerError, OSError) as error:
        dialogs.show_error(parent, "CSV not written", error)
        return None
    _status(parent, f"Per-layer CSV written to {written}")
    return written


def _ask_path(parent: QWidget, title: str, runs: Sequence[RunRecord], name: str, filters: str) -> str:
    path, _ = QFileDialog.getSaveFileName(parent, title, str(dialogs.documents_folder(parent) / name), filters)
    return path


def _status(parent: QWidget, text: str) -> None:
    window = parent.window()
    if isinstance(window, QMainWindow):
        window.statusBar().showMessage(text, 6000)
    logger.info(text)
