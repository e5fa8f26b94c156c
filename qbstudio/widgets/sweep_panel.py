"""Sweeps in the workbench: a grid editor (compiled by ``compiler_core.sweep`` in the background) and the Pareto chart.

The editor builds a sweep grid (calibration mode, percentile, output mode, bias correction,
presets); :class:`SweepPanel` emits it and shows per-point progress, while the main window runs the
sweep and adds each finished point to the runs table. The Pareto chart plots every run of the model:
worst output SQNR against the cost model's estimated latency, MXQ size as marker size.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from qbstudio.state.compare import ParetoData, pareto_data
from qbstudio.state.runs import RunRecord
from qbstudio.state.settings import CHOICE_LABELS
from qbstudio.widgets.layer_plot import _style_axes

logger = logging.getLogger(__name__)

MODES = CHOICE_LABELS["calibration.mode"]
OUTPUTS = {0: "layer", 1: "channel"}
FRONT_COLOUR = "#c62828"
POINT_COLOUR = "#1565c0"


def _check_list(items: dict[Any, str], checked: set[Any]) -> QListWidget:
    widget = QListWidget()
    for value, text in items.items():
        item = QListWidgetItem(text)
        item.setData(Qt.ItemDataRole.UserRole, value)
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(Qt.CheckState.Checked if value in checked else Qt.CheckState.Unchecked)
        widget.addItem(item)
    widget.setMaximumHeight(20 * max(2, len(items)) + 6)
    return widget


def _checked(widget: QListWidget) -> list[Any]:
    return [widget.item(i).data(Qt.ItemDataRole.UserRole) for i in range(widget.count())
            if widget.item(i).checkState() == Qt.CheckState.Checked]


class SweepEditor(QGroupBox):
    """The grid's axes as check lists and fields; :meth:`grid` returns the grid mapping.

    Signals:
        changed(): the user changed an axis (the point count is updated).
        restored(): :meth:`set_checked` set the axes (the point count is updated, nothing is logged).
    """

    changed = Signal()
    restored = Signal()

    def __init__(self, presets: dict[str, str] | None = None, parent: QWidget | None = None) -> None:
        super().__init__("Sweep grid", parent)
        self.modes = _check_list(MODES, {0, 1, 2})
        self.percentiles = QLineEdit("0.999, 0.9999", objectName="sweepPercentiles")
        self.percentiles.setToolTip("Percentile only: comma-separated percentiles")
        self.outputs = _check_list(OUTPUTS, {0})
        self.bias_off = QCheckBox("off", checked=True)
        self.bias_on = QCheckBox("on", checked=True)
        self.presets = _check_list({name: name for name in (presets or {})}, set())
        self.count_label = QLabel(objectName="sweepCount")
        form = QFormLayout(self)
        form.addRow("Calibration mode", self.modes)
        form.addRow("Percentile", self.percentiles)
        form.addRow("Output", self.outputs)
        bias = QHBoxLayout()
        bias.addWidget(self.bias_off)
        bias.addWidget(self.bias_on)
        bias.addStretch(1)
        form.addRow("Bias correction", bias)
        if presets:
            form.addRow("Presets", self.presets)
        form.addRow(self.count_label)
        for widget in (self.modes, self.outputs, self.presets):
            widget.itemChanged.connect(lambda _item: self.changed.emit())
        for box in (self.bias_off, self.bias_on):
            box.toggled.connect(lambda _on: self.changed.emit())
        self.percentiles.textChanged.connect(lambda _text: self.changed.emit())

    def set_checked(self, modes: list[int], bias: tuple[bool, ...] = (False, True), outputs: list[int] = (0,),
                    percentiles: str = "0.999, 0.9999", presets: list[str] = ()) -> None:
        """Set the axes (for tests and for restoring a grid); emits :attr:`restored` once, not :attr:`changed`."""
        fields = (self.modes, self.outputs, self.presets, self.bias_off, self.bias_on, self.percentiles)
        for field in fields:
            field.blockSignals(True)
        for widget, values in ((self.modes, modes), (self.outputs, outputs), (self.presets, presets)):
            for i in range(widget.count()):
                item = widget.item(i)
                item.setCheckState(Qt.CheckState.Checked if item.data(Qt.ItemDataRole.UserRole) in values
                                   else Qt.CheckState.Unchecked)
        self.bias_off.setChecked(False in bias)
        self.bias_on.setChecked(True in bias)
        self.percentiles.setText(percentiles)
        for field in fields:
            field.blockSignals(False)
        self.restored.emit()

    def grid(self) -> dict[str, Any]:
        """The grid mapping (``axes`` in camelCase, as a grid file holds it).

        Raises:
            ValueError: an axis has no value, or a percentile is not a number in (0, 1].
        """
        axes: dict[str, list[Any]] = {}
        modes = _checked(self.modes)
        if not modes:
            raise ValueError("Tick at least one calibration mode.")
        axes["calibrationMode"] = modes
        if 1 in modes:
            try:
                values = [float(text) for text in self.percentiles.text().replace(";", ",").split(",") if text.strip()]
            except ValueError:
                raise ValueError(f"Percentiles must be numbers: {self.percentiles.text()!r}.") from None
            if not values or any(not 0 < v <= 1 for v in values):
                raise ValueError("Give one or more percentiles between 0 and 1 (e.g. 0.999, 0.9999).")
            axes["percentile"] = values
        outputs = _checked(self.outputs)
        if not outputs:
            raise ValueError("Tick at least one output mode.")
        if outputs != [0]:
            axes["outputMode"] = outputs
        bias = [value for value, box in ((False, self.bias_off), (True, self.bias_on)) if box.isChecked()]
        if not bias:
            raise ValueError("Tick bias correction off, on or both.")
        axes["biasCorrection"] = bias
        presets = _checked(self.presets)
        if presets:
            axes["preset"] = presets
        return {"axes": axes}


class ParetoChart(QWidget):
    """Worst output SQNR vs estimated latency of every run; MXQ size as marker size; the front highlighted.

    Signals:
        run_clicked(int): the user clicked the point of this run.
    """

    run_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.data = ParetoData([], [], [], [], [])
        self.caption = QLabel(objectName="paretoCaption", wordWrap=True)
        self.caption.setStyleSheet("color: #444")
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addWidget(self.caption)
        self._items: dict[str, Any] | None = None

    def _build(self) -> dict[str, Any]:
        if self._items is None:
            import pyqtgraph as pg

            plot = pg.PlotWidget(background="w", objectName="paretoPlot")
            _style_axes(plot)
            plot.setLabel("bottom", "latency (ms) — estimated by the cost model, not measured", color="#222")
            plot.setLabel("left", "worst output SQNR (dB)", color="#222")
            for axis in ("bottom", "left"):
                plot.getAxis(axis).enableAutoSIPrefix(False)  # "ms" and "dB" stay as labelled
            # bottom right: the front's best points are top left (high SQNR, low latency)
            legend = plot.addLegend(offset=(-10, -10), labelTextColor="#222", brush=(255, 255, 255, 220))
            front_line = plot.plot([], [], pen=pg.mkPen(FRONT_COLOUR, width=2, style=Qt.PenStyle.DashLine),
                                   name="Pareto front")
            scatter = pg.ScatterPlotItem(hoverable=True, tip=None)
            scatter.sigClicked.connect(self._on_clicked)
            plot.addItem(scatter)
            legend.addItem(pg.ScatterPlotItem(brush=POINT_COLOUR, symbol="o", size=10), "run")
            legend.addItem(pg.ScatterPlotItem(brush=FRONT_COLOUR, symbol="star", size=14), "on the front")
            labels: list[Any] = []
            self._layout.addWidget(plot, 1)
            self._items = {"plot": plot, "scatter": scatter, "front": front_line, "labels": labels}
            self._draw()
        return self._items

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """Build the chart on first show."""
        self._build()
        super().showEvent(event)

    def set_runs(self, runs: list[RunRecord]) -> None:
        """Plot every run that has an accuracy and an estimated latency."""
        self.data = pareto_data(runs)
        self.caption.setText(f"{len(self.data.run_ids)} run(s), {len(self.data.front)} on the front (higher SQNR and "
                             "lower latency are better; marker size = MXQ size). Latency is the cost model's "
                             "estimate. Click a point to compare that run.")
        if self._items is not None:
            self._draw()

    def _draw(self) -> None:
        import pyqtgraph as pg

        items, data = self._items, self.data
        for label in items["labels"]:
            label.hide()
        if not data.run_ids:
            items["scatter"].setData([])
            items["front"].setData([], [])
            return
        sizes = np.asarray(data.size, dtype=float)
        scaled = 10 + 18 * (sizes - sizes.min()) / (np.ptp(sizes) or 1.0)
        front = set(data.front)
        spots = [{"pos": (data.latency[i], data.accuracy[i]), "size": float(scaled[i]), "data": data.run_ids[i],
                  "brush": pg.mkBrush(FRONT_COLOUR if i in front else POINT_COLOUR),
                  "symbol": "star" if i in front else "o", "pen": pg.mkPen("#222", width=0.5)}
                 for i in range(len(data.run_ids))]
        items["scatter"].setData(spots)
        items["front"].setData([data.latency[i] for i in data.front], [data.accuracy[i] for i in data.front])
        low, high = min(data.latency), max(data.latency)
        pad = max((high - low) * 0.08, abs(high) * 0.02, 1e-6)  # equal estimates: a readable axis around them
        items["plot"].setXRange(low - pad, high + pad, padding=0)
        low, high = min(data.accuracy), max(data.accuracy)
        pad = max((high - low) * 0.15, 0.5)  # equal SQNRs (two devices, one quantization): ticks 20.4347132002674
        items["plot"].setYRange(low - pad, high + pad, padding=0)
        while len(items["labels"]) < len(data.run_ids):  # labels are kept and reused (no items dropped per redraw)
            text = pg.TextItem("", color="#222", anchor=(-0.2, 1.1))
            items["plot"].addItem(text)
            items["labels"].append(text)
        for i, run_id in enumerate(data.run_ids):
            text = items["labels"][i]
            text.setText(f"#{run_id}")
            text.setPos(data.latency[i], data.accuracy[i])
            text.show()

    def _on_clicked(self, _item: Any, points: Any, *_args: Any) -> None:
        if len(points):
            self.run_clicked.emit(int(points[0].data()))

    def click_run(self, run_id: int) -> None:
        """Act as if the user clicked the point of ``run_id`` (for tests: the same slot as a click)."""
        scatter = self._build()["scatter"]
        points = [point for point in scatter.points() if point.data() == run_id]
        self._on_clicked(scatter, points)


class SweepPanel(QWidget):
    """The sweep editor with Run/Cancel and per-point progress, beside the Pareto chart.

    Signals:
        sweep_requested(dict): the user pressed Run with this grid mapping.
        cancel_requested(): the user pressed Cancel.
    """

    sweep_requested = Signal(dict)
    cancel_requested = Signal()

    def __init__(self, presets: dict[str, str] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.editor = SweepEditor(presets)
        self.run_button = QPushButton("Run sweep", objectName="runSweep")
        self.cancel_button = QPushButton("Cancel", objectName="cancelSweep", enabled=False)
        self.progress = QProgressBar(objectName="sweepProgress")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status = QLabel("Each point re-quantizes from the cached calibration statistics; finished points "
                             "appear in the runs table.", objectName="sweepStatus", wordWrap=True)
        self.points = QListWidget(objectName="sweepPoints")
        self.chart = ParetoChart()
        self.run_button.clicked.connect(self._on_run)
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.editor.changed.connect(lambda: self._update_count(edited=True))
        self.editor.restored.connect(self._update_count)
        left = QWidget()
        column = QVBoxLayout(left)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.editor)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        column.addLayout(buttons)
        column.addWidget(self.progress)
        column.addWidget(self.status)
        column.addWidget(self.points, 1)
        scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)  # shrinks on short screens
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(left)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(scroll)
        splitter.addWidget(self.chart)
        splitter.setSizes([340, 700])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(splitter)
        self._update_count()

    def point_count(self, duplicates: list[dict[str, Any]] | None = None) -> int | str:
        """How many points the grid expands to, or the reason it is not valid.

        Args:
            duplicates: Receives the axis values of the combinations kept once (same config as an earlier point).
        """
        from compiler_core.errors import QBCompilerError
        from compiler_core.sweep import expand_grid, load_grid

        found = duplicates if duplicates is not None else []
        try:
            spec, folder = load_grid({**self.editor.grid(), "baseConfig": {"targetDevice": "aries-rb"}})
            return len(expand_grid(spec, folder=folder, on_duplicate=found.append))
        except (ValueError, QBCompilerError) as error:
            return str(getattr(error, "message", error))

    def _update_count(self, edited: bool = False) -> None:
        """Show the point count; the combinations kept once are logged only after the user's own edit."""
        duplicates: list[dict[str, Any]] = []
        count = self.point_count(duplicates)
        ok = isinstance(count, int)
        same = f" ({len(duplicates)} same-config combination(s) kept once)" if ok and duplicates else ""
        self.editor.count_label.setText(f"<b>{count} point(s)</b>{same}" if ok else
                                        f"<span style='color:#c62828'>{count}</span>")
        if edited:
            for values in duplicates:
                logger.info("Sweep point %s has the same config as an earlier point; kept once", values)
        self.run_button.setEnabled(ok and not self.cancel_button.isEnabled())

    def _on_run(self) -> None:
        try:
            grid = self.editor.grid()
        except ValueError as error:
            self.status.setText(str(error))
            return
        self.sweep_requested.emit(grid)

    def started(self, names: list[str]) -> None:
        """A sweep of points ``names`` started."""
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.points.clear()
        self.points.addItems([f"{name}: waiting" for name in names])
        self.progress.setRange(0, max(1, len(names)))
        self.progress.setValue(0)
        self.status.setText("Calibration statistics (once, from the cache if present)…")

    def show_event(self, stage: str, done: int, total: int, message: str) -> None:
        """A progress event of the running sweep (``sweep`` counts finished points; ``point-03/quantize`` ...)."""
        if stage == "sweep":
            self.progress.setRange(0, max(1, total))
            self.progress.setValue(done)
            self.status.setText(f"{done} of {total} points done")
        elif "/" in stage:
            name, step = stage.split("/", 1)
            self._set_point(name, f"{step}{f' — {message}' if message else ''}")
        else:
            self.status.setText(message or stage)

    def point_finished(self, name: str, text: str) -> None:
        """Point ``name`` ended (``text``: ok with its numbers, failed, cancelled)."""
        self._set_point(name, text)

    def _set_point(self, name: str, text: str) -> None:
        for i in range(self.points.count()):
            item = self.points.item(i)
            if item.text().split(":", 1)[0] == name:
                item.setText(f"{name}: {text}")
                return

    def finished(self, outcome: str) -> None:
        """The sweep ended: ``outcome`` says how."""
        self.cancel_button.setEnabled(False)
        self.status.setText(outcome)
        self._update_count()
