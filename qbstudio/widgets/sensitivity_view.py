"""The sensitivity table: every layer's output SQNR when quantized alone, its int16 gain and its quantization point.

Shows a :class:`~compiler_core.analysis.sensitivity.SensitivityReport` (as its ``to_dict()``), most
sensitive layer first, sortable by any column; the selected layers can be sent to the int16 layer
list of the Compile settings (``use_int16`` signal) and the report saved as JSON.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from compiler_core.errors import QBCompilerError
from compiler_core.fileio import atomic_write_text
from qbstudio import dialogs
from qbstudio.widgets.screen_fit import resize_within_screen

logger = logging.getLogger(__name__)

COLUMNS = ("Rank", "Layer", "Op", "Alone SQNR (dB)", "Alone cosine", "int16 gain (dB)", "Range", "Clipped %",
           "RMSE / scale")


class _NumberItem(QTableWidgetItem):
    """A cell that sorts by its number (missing values last)."""

    def __init__(self, value: float | None, text: str) -> None:
        super().__init__(text)
        self.value = float("inf") if value is None else float(value)
        self.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)

    def __lt__(self, other: QTableWidgetItem) -> bool:
        return self.value < getattr(other, "value", float("inf"))


def _number(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def row_cells(row: dict[str, Any]) -> list[QTableWidgetItem]:
    """The table cells of one report row."""
    point = row.get("point") or {}
    alone = row.get("alone") or {}
    clip = point.get("clip_ratio")
    low, high = point.get("range") or (None, None)
    range_text = "–" if low is None else f"[{low:.3g}, {high:.3g}] a{point.get('bits')}"
    return [_NumberItem(row["rank"], str(row["rank"])), QTableWidgetItem(row["layer"]), QTableWidgetItem(row["op"]),
            _NumberItem(alone.get("sqnr_db"), _number(alone.get("sqnr_db"), 1)),
            _NumberItem(alone.get("cosine"), _number(alone.get("cosine"), 5)),
            _NumberItem(row.get("gain_db"), _number(row.get("gain_db"), 2)), QTableWidgetItem(range_text),
            _NumberItem(None if clip is None else 100 * clip, _number(None if clip is None else 100 * clip, 3)),
            _NumberItem(point.get("rmse_over_scale"), _number(point.get("rmse_over_scale"), 2))]


class SensitivityView(QWidget):
    """Table of a sensitivity report.

    Signals:
        use_int16(str): the user asked for int16 activations on this layer.
    """

    use_int16 = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.report: dict[str, Any] = {}
        self.summary = QLabel(wordWrap=True, objectName="sensitivitySummary")
        self.table = QTableWidget(0, len(COLUMNS), objectName="sensitivityTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.doubleClicked.connect(lambda _index: self._use_selected())
        for column, tip in ((3, "Worst output SQNR to FP32 with only this layer quantized (the rest float)."),
                            (5, "Output SQNR gained when only this layer is int16 (activations and weights), "
                                "the rest quantized as configured."),
                            (7, "Share of FP32 values on the samples outside the layer's range."),
                            (8, "RMS error of quantizing the FP32 tensor over the step: about 0.29 is pure "
                                "rounding, more means clipping.")):
            self.table.horizontalHeaderItem(column).setToolTip(tip)
        self.use_button = QPushButton("Use int16 for selected", objectName="sensitivityUseInt16")
        self.use_button.clicked.connect(self._use_selected)
        self.save_button = QPushButton("Save report…")
        self.save_button.clicked.connect(self.ask_save)
        buttons = QHBoxLayout()
        buttons.addWidget(self.use_button)
        buttons.addStretch(1)
        buttons.addWidget(self.save_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)

    def set_report(self, report: dict[str, Any]) -> None:
        """Show ``report`` (a ``SensitivityReport.to_dict()``)."""
        self.report = report
        base = report.get("baseline", {})
        self.summary.setText(
            f"{len(report.get('layers', []))} layers, {report.get('samples')} sample(s), {report.get('variants')} "
            f"runs of the {report.get('method', 'proxy')}. Everything quantized as configured: output SQNR "
            f"{_number(base.get('sqnr_db'), 1)} dB, cosine {_number(base.get('cosine'), 5)}. Most sensitive first; "
            "double-click a layer to give it int16 activations in the next compile.")
        self.table.setSortingEnabled(False)
        self.table.setRowCount(0)
        for row in report.get("layers", []):
            position = self.table.rowCount()
            self.table.insertRow(position)
            for column, item in enumerate(row_cells(row)):
                self.table.setItem(position, column, item)
        self.table.setSortingEnabled(True)
        self.table.sortItems(0, Qt.SortOrder.AscendingOrder)
        self.table.resizeColumnsToContents()

    def selected_layers(self) -> list[str]:
        """Layer names of the selected rows (model inputs excluded: they follow their readers)."""
        rows = sorted({index.row() for index in self.table.selectedIndexes()})
        names = [self.table.item(row, 1).text() for row in rows]
        return [name for name in names if not name.startswith("input:")]

    def _use_selected(self) -> None:
        for name in self.selected_layers():
            self.use_int16.emit(name)

    def save(self, path: str | Path) -> Path:
        """Write the report as JSON."""
        return Path(atomic_write_text(path, json.dumps(self.report, indent=2)))

    def ask_save(self) -> None:
        """Ask for a file and save the report there."""
        start = dialogs.documents_folder(self) / "sensitivity.json"
        path, _ = QFileDialog.getSaveFileName(self, "Save sensitivity report", str(start), "JSON (*.json)")
        if not path:
            return
        try:
            self.save(path)
        except QBCompilerError as error:
            dialogs.show_error(self, "Cannot save report", error)


class SensitivityDialog(QDialog):
    """A non-modal window around :class:`SensitivityView`."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Layer sensitivity")
        self.setObjectName("sensitivityDialog")
        self.view = SensitivityView(self)
        layout = QVBoxLayout(self)
        layout.addWidget(self.view)
        resize_within_screen(self, 1040, 560)
