"""Performance tab of the node details: the per-layer cycles of the latest run's MXQ, per core mode.

Reads :func:`compiler_core.runtime.profile.profile_mxq` (the cost model over the tile-level
program). A bar per layer (cycles), the selected node's layer highlighted, and its row: tiles,
split across cores, SRAM (weights, activations, LUTs), MACs, cycles, DRAM bytes, utilisation.
"Colour the graph by cycles" asks the window to colour the Netron graph by each layer's share of the
chosen core mode's latency (:attr:`PerformanceView.colour_by_cycles`).
"""

from __future__ import annotations

import html
import logging
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

logger = logging.getLogger(__name__)

BAR = "#4a7fb5"
SELECTED = "#e07b00"


class PerformanceView(QWidget):
    """Per-layer cycles of one core mode, with the selected layer highlighted.

    Signals:
        colour_by_cycles(str): The graph should be coloured by the cycles of this core mode (``""``: no longer).
    """

    colour_by_cycles = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.report: dict[str, Any] | None = None
        self.layer: str | None = None
        self.mode = QComboBox(objectName="performanceMode")
        self.mode.currentIndexChanged.connect(self.refresh)
        self.mode.currentIndexChanged.connect(self._on_mode)
        self.colour = QCheckBox("Colour the graph by cycles", objectName="performanceColour")
        self.colour.setToolTip("Colour each graph node by its layer's share of the estimated latency of this core mode")
        self.colour.toggled.connect(lambda _checked: self.colour_by_cycles.emit(self.colouring_mode))
        self.summary = QLabel(objectName="performanceSummary")
        self.summary.setTextFormat(Qt.TextFormat.PlainText)  # messages and figures, never HTML
        self.summary.setWordWrap(True)
        self.row = QLabel(objectName="performanceLayer")
        self.row.setWordWrap(True)
        self._plot: Any = None
        self._bars: Any = None
        top = QHBoxLayout()
        top.addWidget(QLabel("Core mode:"))
        top.addWidget(self.mode, 1)
        top.addWidget(self.colour)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(4, 4, 4, 4)
        self._layout.addLayout(top)
        self._layout.addWidget(self.summary)
        self._layout.addWidget(self.row)
        self.set_report(None, "Compile the model to see where the time goes.")

    def set_report(self, report: dict[str, Any] | None, message: str = "", pending: bool = False) -> None:
        """Show a :func:`~compiler_core.runtime.profile.profile_mxq` report (None: ``message`` instead).

        ``pending``: a new run's report is being made; "colour by cycles" stays on and recolours the graph when it
        comes (the switch went off at each compile, the graph back to support status).
        """
        self.report = report
        self.mode.blockSignals(True)
        self.mode.clear()
        if report:
            self.mode.addItems(list(report["modes"]))
        self.mode.blockSignals(False)
        self.mode.setEnabled(bool(report))
        self.colour.setEnabled(bool(report))
        self.summary.setText(message if not report else "")
        self.refresh()
        if not pending:
            self._on_mode()

    @property
    def colouring_mode(self) -> str:
        """The core mode the graph should be coloured by (``""``: none)."""
        return self.mode.currentText() if self.report and self.colour.isChecked() else ""

    def stop_colouring(self) -> None:
        """Uncheck "colour by cycles" without a signal (another colouring took the graph)."""
        self.colour.blockSignals(True)
        self.colour.setChecked(False)
        self.colour.blockSignals(False)

    def _on_mode(self, *_args) -> None:
        if self.colour.isChecked():
            self.colour_by_cycles.emit(self.colouring_mode)

    def select_layer(self, name: str | None) -> None:
        """Highlight the layer whose main operation (or fused epilogue) is node ``name``."""
        self.layer = name
        self.refresh()

    def rows(self) -> list[dict[str, Any]]:
        """Per-layer rows of the chosen mode."""
        if not self.report or not self.mode.currentText():
            return []
        return self.report["modes"][self.mode.currentText()]["layers"]

    def refresh(self) -> None:
        """Redraw for the current mode and layer."""
        rows = self.rows()
        if not rows:
            self.row.setText("")
            if self._bars is not None:
                self._bars.setOpts(x=[], height=[], brushes=[])
            return
        entry = self.report["modes"][self.mode.currentText()]
        from compiler_core.runtime.profile import host_note

        note = host_note(self.report.get("cpu_parts") or [])
        self.summary.setText(f"{entry['latency_ms']:.3f} ms per input{f' ({note})' if note else ''}, "
                             f"{entry['throughput_fps']:,.0f} FPS, "
                             f"{entry['macs'] / 1e6:,.1f} MMACs, DRAM {entry['dram_bytes'] / 1e6:,.2f} MB per input, "
                             f"SRAM peak {entry['sram_peak_bytes'] / 1024:,.0f} KiB")
        index = self._index(rows)
        self._draw(rows, index)
        self.row.setText(_row_text(rows[index]) if index is not None else
                         "This node is not an NPU layer of its own (fused, CPU-offloaded or not compiled).")

    def _index(self, rows: list[dict[str, Any]]) -> int | None:
        for index, row in enumerate(rows):
            if self.layer and (row["layer"] == self.layer or self.layer in row.get("fused", [])
                               or self.layer in row.get("outputs", [])):
                return index
        return None

    def _draw(self, rows: list[dict[str, Any]], selected: int | None) -> None:
        if self._plot is None:
            import pyqtgraph as pg  # loaded when a report is first shown, not at start-up

            self._plot = pg.PlotWidget(background="w")
            self._plot.setLabel("left", "cycles", color="#222")
            self._plot.setLabel("bottom", "layer (execution order)", color="#222")
            self._bars = pg.BarGraphItem(x=[], height=[], width=0.8)
            self._plot.addItem(self._bars)
            self._layout.insertWidget(2, self._plot, 1)
        import numpy as np  # here, not at import: the main window is shown before numpy loads

        x = np.arange(len(rows), dtype=float)
        heights = np.asarray([row["cycles"] for row in rows], dtype=float)
        brushes = [SELECTED if i == selected else BAR for i in range(len(rows))]
        self._bars.setOpts(x=x, height=heights, width=0.8, brushes=brushes, pens=brushes)
        self._plot.setXRange(-1, len(rows), padding=0)
        self._plot.setYRange(0, float(heights.max()) * 1.05 if heights.size and heights.max() > 0 else 1, padding=0)


def _row_text(row: dict[str, Any]) -> str:
    sram = row["sram"]
    fused = f" + {', '.join(row['fused'])}" if row.get("fused") else ""
    return (f"<b>{html.escape(row['layer'] + fused)}</b> on {row['unit']}: {row['tiles']} tile(s), split {row['split']} "
            f"over {row['cores']} core(s); SRAM {sram.get('total', 0) / 1024:,.1f} KiB (weights "
            f"{sram.get('weights', 0) / 1024:,.1f}, activations {sram.get('activations', 0) / 1024:,.1f}, LUTs "
            f"{sram.get('luts', 0) / 1024:,.1f}); {row['macs'] / 1e6:,.2f} MMACs, {row['cycles']:,} cycles "
            f"({row['share']:.1%} of the total), DRAM {row['dram_bytes'] / 1024:,.1f} KiB, "
            f"MAC utilisation {row['utilisation']:.1%}")
