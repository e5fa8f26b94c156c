"""Runs & Compare: the table of past runs and a per-layer SQNR plot of two of them (pyqtgraph)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from qbstudio.state.runs import RunHistory, RunRecord, compare_layers
from qbstudio.widgets.summary import human_size

logger = logging.getLogger(__name__)

RUN_COLUMNS = ("Run", "Finished", "Device", "Settings", "Verdict", "Min SQNR (dB)", "Cosine", "Top-1", "Size",
               "Time (s)")
MAX_TICKS = 24
COLOURS = ("#1565c0", "#ef6c00")


def run_cells(run: RunRecord) -> list[str]:
    """The table cells of one run."""
    head = run.headline()
    return [f"#{run.run_id}", run.created.replace("T", " ")[:19], run.device, run.config_summary,
            head["verdict"] or "—", _number(head["sqnr_db"], 2), _number(head["cosine"], 5),
            "—" if head["top1"] is None else f"{head['top1'] * 100:.1f} %", human_size(run.size_bytes),
            f"{run.duration_s:.1f}"]


def _number(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


@dataclass
class _PlotItems:
    """The pyqtgraph plot of two runs' per-layer SQNR, its legend and its two curves."""

    plot: Any
    legend: Any
    curve_a: Any
    curve_b: Any

    @classmethod
    def build(cls) -> _PlotItems:
        import pyqtgraph as pg  # about 0.4 s: imported when the Runs tab is first shown, not at start-up

        plot = pg.PlotWidget(background="w")
        plot.setLabel("left", "SQNR", units="dB", color="#222")
        plot.setLabel("bottom", "layer (ordered by run A, worst first)", color="#222")
        plot.showGrid(x=True, y=True, alpha=0.3)
        for axis in ("left", "bottom"):
            plot.getAxis(axis).setTextPen("#222")
            plot.getAxis(axis).setPen("#888")
        legend = plot.addLegend(offset=(-10, 10), labelTextColor="#222", brush=(255, 255, 255, 220))
        curve_a = plot.plot([], [], pen=pg.mkPen(COLOURS[0], width=2), symbol="o", symbolSize=5,
                            symbolBrush=COLOURS[0], name="A", connect="finite")
        curve_b = plot.plot([], [], pen=pg.mkPen(COLOURS[1], width=2), symbol="t", symbolSize=6,
                            symbolBrush=COLOURS[1], name="B", connect="finite")
        return cls(plot, legend, curve_a, curve_b)

    def show(self, names: list[str], sqnr_a: list, sqnr_b: list, label_a: str, label_b: str) -> None:
        """Draw the two curves over ``names`` (empty: clear the plot)."""
        x = np.arange(len(names), dtype=float)
        self.curve_a.setData(x, np.asarray(sqnr_a, dtype=float))
        self.curve_b.setData(x, np.asarray(sqnr_b, dtype=float))
        self.legend.items[0][1].setText(label_a)
        self.legend.items[1][1].setText(label_b)
        step = max(1, len(names) // MAX_TICKS)
        ticks = [(i, name[:14]) for i, name in enumerate(names) if i % step == 0]
        self.plot.getAxis("bottom").setTicks([ticks] if names else None)


class CompareView(QWidget):
    """Past runs and the SQNR comparison of two of them.

    Signals:
        run_selected(int): the user selected a run in the table (its id).
    """

    run_selected = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.history = RunHistory()
        self.table = self._make_table()
        self.combo_a, self.combo_b = QComboBox(objectName="runA"), QComboBox(objectName="runB")
        for combo in (self.combo_a, self.combo_b):
            combo.currentIndexChanged.connect(self.update_plot)
        self._plot_holder = QVBoxLayout()
        self._plot_holder.setContentsMargins(0, 0, 0, 0)
        self._plot_items: _PlotItems | None = None  # built on first show: pyqtgraph loads only then
        self.layer_names: list[str] = []
        self._build()

    def _make_table(self) -> QTableWidget:
        table = QTableWidget(0, len(RUN_COLUMNS), objectName="runsTable")
        table.setHorizontalHeaderLabels(RUN_COLUMNS)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        table.verticalHeader().hide()
        table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        table.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        table.itemSelectionChanged.connect(self._on_selection)
        return table

    def _build(self) -> None:
        picker = QHBoxLayout()
        picker.addWidget(QLabel("Compare run A"))
        picker.addWidget(self.combo_a)
        picker.addWidget(QLabel("with run B"))
        picker.addWidget(self.combo_b)
        picker.addStretch(1)
        lower = QWidget()
        lower_layout = QVBoxLayout(lower)
        lower_layout.setContentsMargins(0, 0, 0, 0)
        lower_layout.addLayout(picker)
        lower_layout.addLayout(self._plot_holder, 1)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self.table)
        splitter.addWidget(lower)
        splitter.setSizes([180, 400])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

    def set_history(self, history: RunHistory) -> None:
        """Show the runs of ``history`` (newest selected as B, the one before as A)."""
        self.history = history
        self.table.setRowCount(len(history.runs))
        for row, run in enumerate(history.runs):
            for column, text in enumerate(run_cells(run)):
                item = QTableWidgetItem(text)
                item.setData(Qt.ItemDataRole.UserRole, run.run_id)
                self.table.setItem(row, column, item)
        self._fill_combos()

    def _fill_combos(self) -> None:
        for combo in (self.combo_a, self.combo_b):
            combo.blockSignals(True)
            combo.clear()
            for run in self.history.runs:
                combo.addItem(run.label, run.run_id)
            combo.blockSignals(False)
        count = len(self.history.runs)
        self.combo_a.setCurrentIndex(max(0, count - 2))
        self.combo_b.setCurrentIndex(count - 1)
        self.update_plot()

    @property
    def plot(self):
        """The SQNR plot (a pyqtgraph ``PlotWidget``), built on first use."""
        return self._items().plot

    def _items(self) -> _PlotItems:
        if self._plot_items is None:
            self._plot_items = _PlotItems.build()
            self._plot_holder.addWidget(self._plot_items.plot)
            self.update_plot()
        return self._plot_items

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """Build the plot the first time the view is shown."""
        self._items()
        super().showEvent(event)

    def update_plot(self) -> None:
        """Redraw both curves with setData (the plot items are created once); waits for the plot to exist."""
        items = self._plot_items
        if items is None:
            return
        run_a = self.history.get(self.combo_a.currentData()) if self.combo_a.count() else None
        run_b = self.history.get(self.combo_b.currentData()) if self.combo_b.count() else None
        if run_a is None or run_b is None:
            self.layer_names = []
            items.show([], [], [], "A", "B")
            return
        self.layer_names, sqnr_a, sqnr_b = compare_layers(run_a, run_b)
        items.show(self.layer_names, sqnr_a, sqnr_b, f"A: {run_a.label}", f"B: {run_b.label}")

    def tick_labels(self) -> list[str]:
        """The layer names on the x axis (for tests)."""
        ticks = self._items().plot.getAxis("bottom")._tickLevels
        return [label for level in ticks or [] for _, label in level]

    def legend_texts(self) -> list[str]:
        """The legend's entries (for tests)."""
        return [label.text for _, label in self._items().legend.items]

    def curve_data(self) -> tuple[np.ndarray, np.ndarray]:
        """The y values of curves A and B (for tests)."""
        items = self._items()
        return items.curve_a.getData()[1], items.curve_b.getData()[1]

    def _on_selection(self) -> None:
        items = self.table.selectedItems()
        if items:
            self.run_selected.emit(items[0].data(Qt.ItemDataRole.UserRole))
